// Fused kernels of the GPU decoder step (fewer launches and passes over the activations):
// the q/k/v epilogue (per-head RMSNorm, RoPE and bf16 conversion in one pass over the fused
// q|k|v projection), SwiGLU / GeGLU over the fused gate|up projection, and the residual add
// followed by RMSNorm.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct QkvEpilogueParams {
  const float* qkv;        // [n, (num_q_heads + 2 * num_kv_heads) * head_dim]: q | k | v per token
  const int32_t* positions;  // [n]
  const float* inv_freq;   // [head_dim / 2]
  float rope_factor;       // cos/sin multiplier (YaRN's attention factor)
  const float* q_norm;     // [head_dim] or nullptr: RMSNorm of every q head (Qwen3)
  const float* k_norm;     // [head_dim] or nullptr
  float eps;
  void* q;                 // bf16 [n, num_q_heads, head_dim]
  void* k;                 // bf16 [n, num_kv_heads, head_dim]
  void* v;                 // bf16 [n, num_kv_heads, head_dim]
  // When k_cache is set, K and V rows go straight into the paged KV cache (rows [num_slots,
  // num_kv_heads, head_dim] of cache_dtype, bf16 or fp8 e4m3) at cache_loc[t] instead of into k
  // and v: the attention then runs with save_kv_cache off, one launch fewer per layer. Values
  // are rounded to bf16 first, so the cache holds what set_kv_buffer would have written.
  void* k_cache;
  void* v_cache;
  const int32_t* cache_loc;  // [n]
  int cache_dtype;           // DTypeCode
  float k_scale, v_scale;    // fp8: the cache holds value / scale
  int64_t n;
  int num_q_heads, num_kv_heads, head_dim;  // head_dim even, at most 256
  // Dual chunk attention (attention/cpu/dual_chunk.h) when dca_chunk_len > 0: keys rotate at
  // pos % chunk_len and are multiplied by key_scale[t] (when set); each q head is written as
  // q_variants rotary variants (rows of q_variants * head_dim): intra at pos % chunk_len,
  // successive at min(pos % chunk_len + chunk_len, chunk_size), inter at min(2 chunk_len - 1,
  // chunk_size), and with 5 the sparse pattern's estimates at pos % chunk_len + chunk_len and
  // pos % chunk_len + chunk_size.
  int dca_chunk_len = 0;
  int dca_chunk_size = 0;
  int q_variants = 1;
  const float* key_scale = nullptr;  // [n] or nullptr
};
void qkv_epilogue(const QkvEpilogueParams& p, cudaStream_t s);

// out[t, i] = act(gate_up[t, i]) * gate_up[t, inter + i], act = SiLU or GeLU-tanh.
void gated_activation_fused(const float* gate_up, float* out, int64_t n, int inter, bool gelu, cudaStream_t s);

// x[r, :] += o[r, :]; y[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps). When copy is set, the
// new x[r, :] also goes to copy[r * copy_stride + i] for i < width (a captured hidden state,
// without a copy node of its own). w is read before the programmatic-dependent-launch wait: it
// must not be written by the kernels before this one (norm weights are written at load time).
void add_rms_norm_rows(float* x, const float* o, const float* w, float* y, int64_t rows, int width, float eps,
                       cudaStream_t s, float* copy = nullptr, int64_t copy_stride = 0);

}  // namespace specula::cuda_kernels
