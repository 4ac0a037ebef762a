// The f32 building blocks of the CPU decoders (the target's LlamaModel and the EAGLE heads):
// products through OpenBLAS, RMSNorm and RoPE as Hugging Face computes them in float32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "specula/batch/forward_batch.h"

namespace specula {

// OpenBLAS takes a 128 MiB work buffer per thread at its first large product and keeps it; when
// the address space cannot hold one (a low `ulimit -v`), it retries the allocation for ever. This
// takes the buffers up front, with one small product on every thread, after checking that the
// address space left can hold them; throws specula::Error naming the limit when it cannot. Call
// it before the engine allocates anything (the CLI does, first thing).
void reserve_cpu_blas_buffers();

// y[n, out] = x[n, in] * w[out, in]^T (w row-major).
void cpu_linear(const float* x, const std::vector<float>& w, float* y, int64_t n, int in, int out);
// y[n, out] = x[n, in] * w with w [in, out] (w_transposed false) or w[out, in]^T (true); rows of
// x, w and y are ldx, ldw and ldy floats apart (per-head slices of wider tensors).
void cpu_matmul(const float* x, int64_t ldx, const float* w, int64_t ldw, bool w_transposed, float* y, int64_t ldy,
                int64_t n, int in, int out);
// y[r, :] += bias for each of n rows.
void cpu_add_bias(float* y, const std::vector<float>& bias, int64_t n);
// y = w * (x / rms(x)) per row of `hidden`; in place is allowed (y == x).
void cpu_rms_norm(const float* x, const std::vector<float>& w, float* y, int64_t n, int hidden, float eps);
// x = silu(gate) * up, element-wise over gate (in place in gate).
void cpu_silu_mul(std::vector<float>& gate, const std::vector<float>& up);

// The decoders' head: final RMSNorm and lm_head [vocab, hidden] over x [num_tokens, hidden],
// for every token (all_tokens) or each request's last one; logits [rows, vocab].
void cpu_final_logits(const float* x, const ForwardBatch& batch, bool all_tokens, const std::vector<float>& norm,
                      const std::vector<float>& lm_head, int hidden, int vocab, float eps, std::vector<float>& logits);

// RoPE of n tokens at `positions`: cos/sin are computed once per token in f32 (as Hugging Face
// does) and scaled by attention_factor (yarn), then applied to any number of tensors: contiguous
// [n, heads, head_dim] ones (rotate-half), or head slices of wider rows, over halves or adjacent
// pairs.
class CpuRope {
 public:
  CpuRope(std::span<const int32_t> positions, const std::vector<float>& inv_freq, float attention_factor);
  void apply(float* data, int heads) const { apply(data, heads, static_cast<int64_t>(heads) * 2 * half_, 2 * half_, false); }
  // Rotates head_dim values at data + t * token_stride + h * head_stride for each token t and head
  // h. interleaved: pairs (2i, 2i + 1) turn by angle i (DeepSeek's layout) instead of (i, i + d/2).
  void apply(float* data, int heads, int64_t token_stride, int head_stride, bool interleaved) const;

 private:
  int64_t n_;
  int half_;
  std::vector<float> cos_, sin_;
};

}  // namespace specula
