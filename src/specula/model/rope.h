// Rotary position embedding frequencies for each rope scaling type of Hugging Face configs:
// default, linear, dynamic (NTK, with the base fixed for the longest supported context, as SGLang
// and vLLM precompute it), llama3 and yarn (whose attention factor scales cos and sin).
#pragma once

#include <vector>

#include "specula/model/config.h"

namespace specula {

struct RopeFrequencies {
  std::vector<float> inv_freq;   // [head_dim / 2]
  float attention_factor = 1.0f; // multiplies cos and sin (yarn's mscale)
};

RopeFrequencies compute_rope_frequencies(const ModelConfig& config);

// YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1).
double yarn_get_mscale(double factor, double mscale);

}  // namespace specula
