// A Qwen2-VL vision block in float64 written out from its definition (patch positions from their
// index, the 2D rotary embedding pair by pair, the full block-diagonal attention matrix), for the
// CPU and CUDA vision tests.
#pragma once

#include <random>
#include <vector>

#include "specula/model/vision.h"

namespace specula::testing {

// Weights drawn so that activations stay O(1): projections N(0, 1/fan_in), norms 1 + N(0, 0.1).
VisionBlockWeights random_vision_block(int hidden, int heads, int mlp, std::mt19937_64& rng);

// The block's output for x [num_patches, hidden] in patch order (see vision_layout).
std::vector<double> reference_vision_block(const VisionBlockWeights& w, const std::vector<float>& x,
                                           const std::vector<VisionGrid>& grids, int merge, double theta);

// max |got - want| / max(1, max |want|).
double relative_max_error(const std::vector<float>& got, const std::vector<double>& want);

}  // namespace specula::testing
