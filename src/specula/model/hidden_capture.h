// HiddenCapture: hidden states of the target that a speculative draft head consumes (its
// "features"), captured during a forward over every token of the batch.
#pragma once

#include <cstdint>
#include <vector>

#include "specula/core/error.h"

namespace specula {

struct HiddenCapture {
  // The final normed hidden state (the input of lm_head), which EAGLE heads read.
  static constexpr int kFinalNormed = -1;
  // What to capture, in order: kFinalNormed, or i >= 0 for the residual stream entering decoder
  // layer i (EAGLE-3 reads three of these).
  std::vector<int> layers;
  // Out: [num_tokens, layers.size() * hidden_size]; each token's entries concatenated in order.
  std::vector<float> data;
  // false: a GPU model keeps the states on the device only (for work queued through
  // SpecInfo::on_device_results) and leaves data empty.
  bool download = true;

  // Checks the requested layers against a model of num_layers and sizes data for n tokens.
  void prepare(int num_layers, int64_t n, int hidden) {
    for (int layer : layers) {
      SPECULA_CHECK(layer == kFinalNormed || (layer >= 0 && layer < num_layers),
                    "cannot capture the hidden state entering layer {}; the model has {} layers", layer, num_layers);
    }
    if (download) {
      data.assign(static_cast<size_t>(n) * layers.size() * static_cast<size_t>(hidden), 0.0f);
    } else {
      data.clear();
    }
  }
};

}  // namespace specula
