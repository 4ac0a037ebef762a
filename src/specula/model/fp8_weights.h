// Fp8BlockWeights: a checkpoint of fp8 block-scaled weights (quantization_config fp8, DeepSeek-V3's
// layout: an e4m3 matrix [out, in] and "<name>_scale_inv", f32 [ceil(out / block_out),
// ceil(in / block_in)], the value being e4m3 x scale) read as f32 matrices, each dequantized
// when it is read (DeepSeek's weight_dequant). Tensors stored otherwise pass through.
#pragma once

#include <string>

#include "specula/core/tensor.h"
#include "specula/model/config.h"
#include "specula/model/weights.h"

namespace specula {

class Fp8BlockWeights final : public WeightSource {
 public:
  Fp8BlockWeights(const WeightSource& inner, const ModelConfig& config);
  // A dequantized view stays valid until the next call, as a synthetic source's does.
  TensorView get(const std::string& name, const Shape& shape) const override;
  bool contains(const std::string& name) const override { return inner_.contains(name); }
  size_t total_bytes() const override { return inner_.total_bytes(); }

 private:
  const WeightSource& inner_;
  int block_out_, block_in_;
  mutable Buffer scratch_;
};

}  // namespace specula
