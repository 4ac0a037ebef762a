// MLA decoder kernels: one block per row (norm) or per (token, head) (packing).
#include "specula/model/cuda/mla_ops.h"

#include <cuda_bf16.h>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/model/cuda/reduce.cuh"

namespace specula::cuda_kernels {

namespace {

__global__ void rms_norm_strided_kernel(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                                        int width, float eps) {
  pdl_wait();
  pdl_trigger();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * y_stride;
  float sum = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < width; i += static_cast<int>(blockDim.x)) sum += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(sum) / static_cast<float>(width) + eps);
  for (int i = static_cast<int>(threadIdx.x); i < width; i += static_cast<int>(blockDim.x)) yr[i] = w[i] * (xr[i] * inv);
}

// Rotates the rope_dim values of src through store(offset, value): pair i (offsets a and a +
// partner) turns by angle i, as CpuRope does: f32 angles, cos/sin times rope_factor.
template <typename Store>
__device__ void rotate_pairs(const float* src, const MlaPackParams& p, int32_t position, Store store) {
  const int half = p.rope_dim / 2, step = p.interleave ? 2 : 1, partner = p.interleave ? 1 : half;
  for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
    const float angle = static_cast<float>(position) * p.inv_freq[i];
    const float c = cosf(angle) * p.rope_factor, s = sinf(angle) * p.rope_factor;
    const int a = i * step;
    const float x0 = src[a], x1 = src[a + partner];
    store(a, x0 * c - x1 * s);
    store(a + partner, x1 * c + x0 * s);
  }
}

// blockIdx.x: token; blockIdx.y: query head, or heads for the token's RoPE key.
__global__ void mla_pack_kernel(MlaPackParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int32_t position = p.positions[t];
  if (h == p.heads) {
    float* k = p.k_pe_out + t * p.rope_dim;
    rotate_pairs(p.kv_a + t * p.kv_a_stride, p, position, [&](int i, float v) { k[i] = v; });
    return;
  }
  const bool expanded = p.q_latent == nullptr;
  const int lead = expanded ? p.q_pe_offset : p.kv_lora_rank;
  auto* out = static_cast<__nv_bfloat16*>(p.q_out) + (t * p.heads + h) * (lead + p.rope_dim);
  const float* q_head = p.q + t * p.q_stride + static_cast<int64_t>(h) * p.qk_head_dim;
  const float* src = expanded ? q_head : p.q_latent + (t * p.heads + h) * p.kv_lora_rank;
  for (int i = static_cast<int>(threadIdx.x); i < lead; i += static_cast<int>(blockDim.x)) {
    out[i] = __float2bfloat16_rn(src[i]);
  }
  rotate_pairs(q_head + p.q_pe_offset, p, position, [&](int i, float v) { out[lead + i] = __float2bfloat16_rn(v); });
}

// blockIdx.x: row; the row's k_pe (rope values) into every head.
__global__ void mla_broadcast_k_pe_kernel(const __nv_bfloat16* k_pe, __nv_bfloat16* k, int heads, int nope, int rope) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x;
  for (int i = static_cast<int>(threadIdx.x); i < heads * rope; i += static_cast<int>(blockDim.x)) {
    const int h = i / rope, d = i % rope;
    k[(r * heads + h) * (nope + rope) + nope + d] = k_pe[r * rope + d];
  }
}

}  // namespace

void rms_norm_strided(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int64_t rows,
                      int width, float eps, cudaStream_t s) {
  if (rows == 0) return;
  launch_pdl(rms_norm_strided_kernel, static_cast<unsigned>(rows), row_threads(width), 0, s, x, x_stride, w, y,
             y_stride, width, eps);
  CUDA_CHECK(cudaGetLastError());
}

void mla_pack(const MlaPackParams& p, cudaStream_t s) {
  if (p.n == 0) return;
  launch_pdl(mla_pack_kernel, dim3(static_cast<unsigned>(p.n), static_cast<unsigned>(p.heads + 1)), 128, 0, s, p);
  CUDA_CHECK(cudaGetLastError());
}

void mla_broadcast_k_pe(const void* k_pe, void* k, int64_t rows, int heads, int nope, int rope, cudaStream_t s) {
  if (rows == 0) return;
  launch_pdl(mla_broadcast_k_pe_kernel, static_cast<unsigned>(rows), 256, 0, s, static_cast<const __nv_bfloat16*>(k_pe),
             static_cast<__nv_bfloat16*>(k), heads, nope, rope);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
