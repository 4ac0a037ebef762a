// Kernels of the GPU DeepSeek (MLA) decoder step around the attention: RMSNorm over strided
// row slices (q_a_layernorm and kv_a_layernorm read columns of the fused down-projection), the
// packing of the queries (absorbed or expanded) and the RoPE keys, and the expanded form's RoPE
// keys per head.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// y[r * y_stride + i] = w[i] * x[r * x_stride + i] / sqrt(mean_i(x[r, i]^2) + eps), i < width.
void rms_norm_strided(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int64_t rows,
                      int width, float eps, cudaStream_t s);

struct MlaPackParams {
  const float* q_latent;   // [n, heads, kv_lora_rank]: q_nope W_UK per head; nullptr: the expanded
                           // form, whose queries lead with q_nope itself (q_pe_offset values)
  const float* q;          // [n, heads, qk_head_dim] rows q_stride apart: q_pe at column q_pe_offset of each head
  int64_t q_stride;
  int qk_head_dim, q_pe_offset;
  const float* kv_a;       // k_pe before RoPE at kv_a + t * kv_a_stride
  int64_t kv_a_stride;
  const int32_t* positions;  // [n]
  const float* inv_freq;     // [rope_dim / 2]
  float rope_factor;         // cos/sin multiplier (YaRN)
  bool interleave;           // pairs (2i, 2i + 1) instead of (i, i + rope_dim / 2)
  void* q_out;               // bf16 [n, heads, kv_lora_rank + rope_dim]: [q_latent ; RoPE(q_pe)], or
                             // [n, heads, q_pe_offset + rope_dim]: [q_nope ; RoPE(q_pe)]
  float* k_pe_out;           // f32 [n, rope_dim]: RoPE(k_pe)
  int64_t n;
  int heads, kv_lora_rank, rope_dim;
};
void mla_pack(const MlaPackParams& p, cudaStream_t s);

// The expanded form's keys k bf16 [rows, heads, nope + rope]: the cached RoPE key k_pe bf16
// [rows, rope] into columns nope.. of every head (kv_b_proj's products write columns 0..nope).
void mla_broadcast_k_pe(const void* k_pe, void* k, int64_t rows, int heads, int nope, int rope, cudaStream_t s);

}  // namespace specula::cuda_kernels
