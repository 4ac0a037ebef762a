// Fp8BlockWeights: a checkpoint of fp8 block-scaled weights (quantization_config fp8, DeepSeek-V3's
// layout: an e4m3 matrix [out, in] and "<name>_scale_inv", f32 [ceil(out / block_out),
// ceil(in / block_in)], the value being e4m3 x scale) read as bf16 matrices, each dequantized
// when it is read as DeepSeek's weight_dequant does it (the f32 product rounded to the default
// bf16): the GPU then holds them in bf16, not f32. Tensors stored otherwise pass through.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

  // Matrix `name` as stored: its e4m3 codes and f32 scales ([block_rows, block_cols] blocks of
  // block_out() x block_in() values), for a GPU model that keeps the weights in fp8; false when
  // the checkpoint holds it otherwise.
  struct Fp8Matrix {
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    int64_t block_rows = 0, block_cols = 0;
  };
  bool fp8_matrix(const std::string& name, const Shape& shape, Fp8Matrix& out) const;
  int block_out() const { return block_out_; }
  int block_in() const { return block_in_; }

 private:
  // t: the stored fp8 view of `name`.
  void read_fp8(const std::string& name, const Shape& shape, const TensorView& t, Fp8Matrix& out) const;

  const WeightSource& inner_;
  int block_out_, block_in_;
  mutable Buffer scratch_;
};

}  // namespace specula
