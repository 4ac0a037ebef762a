// The absorbed MLA form's per-head products for a few query tokens (decode at small batch), over
// kv_b_proj's f32 rows: q_latent = q_nope W_UK before the attention, values = o W_UV^T after it.
// cuBLAS's strided-batched GEMM picks latency-bound kernels for one row and breaks the chain of
// programmatic dependent launches; these read their weights before waiting on the kernel before
// them, and the second reads the attention's bf16 output directly (no f32 copy of it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// Tokens these kernels take in one launch (the weights are held in registers across them).
constexpr int kMlaAbsorbMaxTokens = 4;

// Whether the kernels serve n tokens of `heads` heads of kv_b_proj rows [nope + vd][R]
// (R = kv_lora_rank); the model falls back to cuBLAS otherwise.
bool mla_absorb_fits(int64_t n, int heads, int nope, int vd, int kv_lora_rank);

// q_latent[t, h, :] (f32 [n, heads, R]) = sum_d q[t * q_stride + h * qk_head_dim + d] * W_UK[h][d, :],
// d < nope, where W_UK[h][d, :] is row h * (nope + vd) + d of wkv_b (f32 [heads * (nope + vd), R]).
void mla_absorb_uk(const float* q, int64_t q_stride, int qk_head_dim, const float* wkv_b, float* q_latent, int64_t n,
                   int heads, int nope, int vd, int kv_lora_rank, cudaStream_t s);

// values[t, h, v] (f32 [n, heads, vd]) = sum_r o[t, h, r] * W_UV[h][v, r], o bf16 [n, heads, R],
// W_UV[h][v, :] row h * (nope + vd) + nope + v of wkv_b.
void mla_absorb_uv(const void* o, const float* wkv_b, float* values, int64_t n, int heads, int nope, int vd,
                   int kv_lora_rank, cudaStream_t s);

}  // namespace specula::cuda_kernels
