// Fp8BlockWeights: the scale lookup and the dequantization.
#include "specula/model/fp8_weights.h"

#include <vector>

#include "specula/core/dtype.h"
#include "specula/core/error.h"

namespace specula {

Fp8BlockWeights::Fp8BlockWeights(const WeightSource& inner, const ModelConfig& config)
    : inner_(inner), block_out_(config.fp8_block_out), block_in_(config.fp8_block_in) {
  SPECULA_CHECK(block_out_ > 0 && block_in_ > 0, "Fp8BlockWeights: the config has no fp8 weight_block_size");
}

bool Fp8BlockWeights::fp8_matrix(const std::string& name, const Shape& shape, Fp8Matrix& out) const {
  const TensorView t = inner_.get(name, shape);
  if (t.dtype() != DType::fp8_e4m3) return false;
  read_fp8(name, shape, t, out);
  return true;
}

void Fp8BlockWeights::read_fp8(const std::string& name, const Shape& shape, const TensorView& t, Fp8Matrix& out) const {
  SPECULA_CHECK(shape.rank() == 2, "tensor '{}' is fp8 with shape {}; block scales cover matrices only", name, shape.str());
  // The inner view may be scratch that the next call replaces (a synthetic source's): the codes
  // are copied before the scales are read.
  out.codes.assign(static_cast<const uint8_t*>(t.data()), static_cast<const uint8_t*>(t.data()) + t.numel());
  const std::string scale_name = name + "_scale_inv";
  SPECULA_CHECK(inner_.contains(scale_name), "tensor '{}' is fp8 but the checkpoint has no '{}'", name, scale_name);
  out.block_rows = (shape[0] + block_out_ - 1) / block_out_;
  out.block_cols = (shape[1] + block_in_ - 1) / block_in_;
  const TensorView s = inner_.get(scale_name, {out.block_rows, out.block_cols});
  out.scales.resize(static_cast<size_t>(s.numel()));
  convert_to_float(s.data(), s.dtype(), out.scales.data(), out.scales.size());
}

TensorView Fp8BlockWeights::get(const std::string& name, const Shape& shape) const {
  const TensorView t = inner_.get(name, shape);
  if (t.dtype() != DType::fp8_e4m3) return t;
  Fp8Matrix m;
  read_fp8(name, shape, t, m);
  const int64_t rows = shape[0], cols = shape[1];
  scratch_ = Buffer(DType::bf16, shape);
  auto* out = static_cast<uint16_t*>(scratch_.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = m.scales.data() + (r / block_out_) * m.block_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = fp8_e4m3_bits_to_float(m.codes[static_cast<size_t>(r * cols + c)]) * scale_row[c / block_in_];
      out[r * cols + c] = float_to_bf16_bits(v);
    }
  }
  return scratch_.view();
}

}  // namespace specula
