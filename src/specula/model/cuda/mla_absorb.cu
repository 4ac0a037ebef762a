// The absorbed MLA products for a few tokens (mla_absorb.h). Both kernels issue every weight load
// of a thread before pdl_wait(), so a layer's 2 x 4.2 MB (DeepSeek-V2-Lite) stream while the
// kernel before finishes; each weight is then applied to every token from registers.
#include "specula/model/cuda/mla_absorb.h"

#include <cuda_bf16.h>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/error.h"

namespace specula::cuda_kernels {

namespace {

// W_UK: a block takes one head and 64 columns of R: 16 groups of 16 threads, a thread one float4
// of columns over rows grp, grp + 16, ... of the head's nope rows; the groups' sums meet in
// shared memory.
constexpr int kUkCols = 64, kUkGroups = 16, kUkThreads = kUkGroups * kUkCols / 4, kUkMaxRowSteps = 8;
// W_UV: a warp takes one weight row (one value of one head), a lane float4s lane, lane + 32, ...
constexpr int kUvWarps = 8, kUvMaxChunks = 4;

__global__ void __launch_bounds__(kUkThreads) mla_absorb_uk_kernel(const float* q, int64_t q_stride, int qk,
                                                                   const float* wkv_b, float* q_latent, int n, int heads,
                                                                   int nope, int vd, int R) {
  const int h = static_cast<int>(blockIdx.y), tid = static_cast<int>(threadIdx.x);
  const int c4 = tid % (kUkCols / 4), grp = tid / (kUkCols / 4);
  const int col = static_cast<int>(blockIdx.x) * kUkCols + 4 * c4;
  const float* wh = wkv_b + static_cast<int64_t>(h) * (nope + vd) * R;
  float4 w[kUkMaxRowSteps];
#pragma unroll
  for (int i = 0; i < kUkMaxRowSteps; ++i) {
    const int d = grp + kUkGroups * i;
    w[i] = d < nope && col < R ? __ldg(reinterpret_cast<const float4*>(wh + static_cast<int64_t>(d) * R + col))
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_wait();
  pdl_trigger();
  __shared__ float4 part[kMlaAbsorbMaxTokens][kUkGroups][kUkCols / 4];
  for (int t = 0; t < n; ++t) {
    const float* qh = q + t * q_stride + static_cast<int64_t>(h) * qk;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < kUkMaxRowSteps; ++i) {
      const int d = grp + kUkGroups * i;
      const float a = d < nope ? qh[d] : 0.0f;
      acc.x = fmaf(a, w[i].x, acc.x);
      acc.y = fmaf(a, w[i].y, acc.y);
      acc.z = fmaf(a, w[i].z, acc.z);
      acc.w = fmaf(a, w[i].w, acc.w);
    }
    part[t][grp][c4] = acc;
  }
  __syncthreads();
  if (tid >= n * (kUkCols / 4)) return;
  const int t = tid / (kUkCols / 4), c = tid % (kUkCols / 4);
  const int out_col = static_cast<int>(blockIdx.x) * kUkCols + 4 * c;
  if (out_col >= R) return;
  float4 sum = part[t][0][c];
  for (int g = 1; g < kUkGroups; ++g) {
    const float4 v = part[t][g][c];
    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
  }
  *reinterpret_cast<float4*>(q_latent + (static_cast<int64_t>(t) * heads + h) * R + out_col) = sum;
}

__global__ void __launch_bounds__(kUvWarps * 32) mla_absorb_uv_kernel(const __nv_bfloat16* o, const float* wkv_b,
                                                                      float* values, int n, int heads, int nope, int vd,
                                                                      int R) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row = static_cast<int>(blockIdx.x) * kUvWarps + static_cast<int>(threadIdx.x) / 32;
  const bool valid = row < heads * vd;
  const int h = valid ? row / vd : 0, v = valid ? row % vd : 0;
  const float* wr = wkv_b + (static_cast<int64_t>(h) * (nope + vd) + nope + v) * R;
  float4 w[kUvMaxChunks];
#pragma unroll
  for (int i = 0; i < kUvMaxChunks; ++i) {
    const int c = 4 * (lane + 32 * i);
    w[i] = valid && c < R ? __ldg(reinterpret_cast<const float4*>(wr + c)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_wait();
  pdl_trigger();
  if (!valid) return;
  for (int t = 0; t < n; ++t) {
    const __nv_bfloat16* oh = o + (static_cast<int64_t>(t) * heads + h) * R;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kUvMaxChunks; ++i) {
      const int c = 4 * (lane + 32 * i);
      if (c >= R) continue;
      const uint2 raw = *reinterpret_cast<const uint2*>(oh + c);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      acc = fmaf(a.x, w[i].x, acc);
      acc = fmaf(a.y, w[i].y, acc);
      acc = fmaf(b.x, w[i].z, acc);
      acc = fmaf(b.y, w[i].w, acc);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) values[(static_cast<int64_t>(t) * heads + h) * vd + v] = acc;
  }
}

}  // namespace

bool mla_absorb_fits(int64_t n, int heads, int nope, int vd, int kv_lora_rank) {
  return n >= 1 && n <= kMlaAbsorbMaxTokens && heads >= 1 && heads <= 65535 && nope >= 1 &&
         nope <= kUkGroups * kUkMaxRowSteps && vd >= 1 && kv_lora_rank >= 4 && kv_lora_rank % 4 == 0 &&
         kv_lora_rank <= 4 * 32 * kUvMaxChunks;
}

namespace {

void check_fits(const char* kernel, int64_t n, int heads, int nope, int vd, int kv_lora_rank) {
  SPECULA_CHECK(mla_absorb_fits(n, heads, nope, vd, kv_lora_rank),
                "{}: {} tokens of {} heads, nope {}, v {}, kv_lora_rank {} (at most {} tokens, 65535 heads and {} nope "
                "rows; the rank a multiple of 4 up to {})",
                kernel, n, heads, nope, vd, kv_lora_rank, kMlaAbsorbMaxTokens, kUkGroups * kUkMaxRowSteps,
                4 * 32 * kUvMaxChunks);
}

}  // namespace

void mla_absorb_uk(const float* q, int64_t q_stride, int qk_head_dim, const float* wkv_b, float* q_latent, int64_t n,
                   int heads, int nope, int vd, int kv_lora_rank, cudaStream_t s) {
  check_fits("mla_absorb_uk", n, heads, nope, vd, kv_lora_rank);
  const dim3 grid(static_cast<unsigned>((kv_lora_rank + kUkCols - 1) / kUkCols), static_cast<unsigned>(heads));
  launch_pdl(mla_absorb_uk_kernel, grid, kUkThreads, 0, s, q, q_stride, qk_head_dim, wkv_b, q_latent,
             static_cast<int>(n), heads, nope, vd, kv_lora_rank);
}

void mla_absorb_uv(const void* o, const float* wkv_b, float* values, int64_t n, int heads, int nope, int vd,
                   int kv_lora_rank, cudaStream_t s) {
  check_fits("mla_absorb_uv", n, heads, nope, vd, kv_lora_rank);
  const int64_t rows = static_cast<int64_t>(heads) * vd;
  launch_pdl(mla_absorb_uv_kernel, static_cast<unsigned>((rows + kUvWarps - 1) / kUvWarps), kUvWarps * 32, 0, s,
             static_cast<const __nv_bfloat16*>(o), wkv_b, values, static_cast<int>(n), heads, nope, vd, kv_lora_rank);
}

}  // namespace specula::cuda_kernels
