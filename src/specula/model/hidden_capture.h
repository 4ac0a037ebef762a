// HiddenCapture: hidden states of the target that a speculative draft head consumes (its
// "features"), captured during a forward over every token of the batch.
#pragma once

#include <vector>

namespace specula {

struct HiddenCapture {
  // The final normed hidden state (the input of lm_head), which EAGLE heads read.
  static constexpr int kFinalNormed = -1;
  // What to capture, in order: kFinalNormed, or i >= 0 for the residual stream entering decoder
  // layer i (EAGLE-3 reads three of these).
  std::vector<int> layers;
  // Out: [num_tokens, layers.size() * hidden_size]; each token's entries concatenated in order.
  std::vector<float> data;
};

}  // namespace specula
