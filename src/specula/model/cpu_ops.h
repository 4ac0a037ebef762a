// The f32 building blocks of the CPU decoders (the target's LlamaModel and the EAGLE heads):
// products through OpenBLAS, RMSNorm and RoPE as Hugging Face computes them in float32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specula {

// y[n, out] = x[n, in] * w[out, in]^T (w row-major).
void cpu_linear(const float* x, const std::vector<float>& w, float* y, int64_t n, int in, int out);
// y[r, :] += bias for each of n rows.
void cpu_add_bias(float* y, const std::vector<float>& bias, int64_t n);
// y = w * (x / rms(x)) per row of `hidden`; in place is allowed (y == x).
void cpu_rms_norm(const float* x, const std::vector<float>& w, float* y, int64_t n, int hidden, float eps);
// x = silu(gate) * up, element-wise over gate (in place in gate).
void cpu_silu_mul(std::vector<float>& gate, const std::vector<float>& up);

// Rotate-half RoPE of n tokens at `positions`: cos/sin are computed once per token in f32 (as
// Hugging Face does) and scaled by attention_factor (yarn), then applied to any number of
// [n, heads, head_dim] tensors.
class CpuRope {
 public:
  CpuRope(std::span<const int32_t> positions, const std::vector<float>& inv_freq, float attention_factor);
  void apply(float* data, int heads) const;

 private:
  int64_t n_;
  int half_;
  std::vector<float> cos_, sin_;
};

}  // namespace specula
