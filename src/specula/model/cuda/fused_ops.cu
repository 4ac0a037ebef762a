// Fused decoder kernels: one warp per (token, head) for the q/k/v epilogue, one thread per
// element for the gated activation, one block per row for add + RMSNorm (rows of float4s in
// registers where they fit, the general loop otherwise).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "specula/core/convert.cuh"
#include "specula/core/dtype_codes.h"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/model/cuda/activation.cuh"
#include "specula/model/cuda/fused_ops.h"
#include "specula/model/cuda/reduce.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kEpilogueWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kEpilogueWarps * 32) qkv_epilogue_kernel(QkvEpilogueParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ float head[kEpilogueWarps][kMaxHeadDim];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kEpilogueWarps + warp;
  if (item >= p.n * heads) return;
  const int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const int D = p.head_dim, half = D / 2;
  const float* src = p.qkv + item * D;  // heads of a token are contiguous: q | k | v
  float* x = head[warp];
  for (int i = lane; i < D; i += 32) x[i] = src[i];
  __syncwarp();
  const bool is_q = h < p.num_q_heads, is_k = !is_q && h < p.num_q_heads + p.num_kv_heads;
  const float* norm = is_q ? p.q_norm : (is_k ? p.k_norm : nullptr);
  if (norm != nullptr) {
    float sum = 0.0f;
    for (int i = lane; i < D; i += 32) sum += x[i] * x[i];
    const float inv = rsqrtf(warp_sum(sum) / static_cast<float>(D) + p.eps);
    __syncwarp();
    for (int i = lane; i < D; i += 32) x[i] = norm[i] * (x[i] * inv);
    __syncwarp();
  }
  const int kv_head = is_q ? 0 : (h - p.num_q_heads) % p.num_kv_heads;
  // Where the row goes: q, or a K/V row of the cache (to_cache), or of k / v.
  const bool to_cache = !is_q && p.k_cache != nullptr;
  void* dst_base;
  int64_t row;
  if (is_q) {
    dst_base = p.q;
    row = t * p.num_q_heads + h;
  } else if (to_cache) {
    dst_base = is_k ? p.k_cache : p.v_cache;
    row = static_cast<int64_t>(p.cache_loc[t]) * p.num_kv_heads + kv_head;
  } else {
    dst_base = is_k ? p.k : p.v;
    row = t * p.num_kv_heads + kv_head;
  }
  const bool fp8 = to_cache && p.cache_dtype == kFp8E4m3;
  const float div = is_k ? p.k_scale : p.v_scale;
  auto put = [&](int64_t index, float value) {
    const __nv_bfloat16 b = __float2bfloat16_rn(value);
    if (fp8) {
      static_cast<__nv_fp8_e4m3*>(dst_base)[index] = from_float<__nv_fp8_e4m3>(__bfloat162float(b) / div);
    } else {
      static_cast<__nv_bfloat16*>(dst_base)[index] = b;
    }
  };
  // Rotates x at `position` into row `at` (elements), times `mul`.
  auto rotate = [&](int position, int64_t at, float mul) {
    const float pos = static_cast<float>(position);
    for (int i = lane; i < half; i += 32) {
      // f32 angle, as the CPU path and Hugging Face compute it.
      float sn, cs;
      sincosf(pos * p.inv_freq[i], &sn, &cs);
      cs *= p.rope_factor;
      sn *= p.rope_factor;
      const float a = x[i], b = x[i + half];
      put(at + i, (a * cs - b * sn) * mul);
      put(at + i + half, (b * cs + a * sn) * mul);
    }
  };
  const int position = p.positions[t];
  if (p.dca_chunk_len > 0 && (is_q || is_k)) {
    const int cl = p.dca_chunk_len, cs = p.dca_chunk_size, in_chunk = position % cl;
    if (is_k) {
      rotate(in_chunk, row * D, p.key_scale != nullptr ? p.key_scale[t] : 1.0f);
    } else {
      const int at[5] = {in_chunk, min(in_chunk + cl, cs), min(2 * cl - 1, cs), in_chunk + cl, in_chunk + cs};
      for (int variant = 0; variant < p.q_variants; ++variant) {
        rotate(at[variant], (row * p.q_variants + variant) * D, 1.0f);
      }
    }
  } else if (is_q || is_k) {
    rotate(position, row * D, 1.0f);
  } else {
    for (int i = lane; i < D; i += 32) put(row * D + i, x[i]);
  }
}

__global__ void gated_fused_kernel(const float* gate_up, float* out, int64_t n, int inter, bool gelu) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * inter) return;
  const int64_t t = i / inter;
  const int c = static_cast<int>(i % inter);
  const float g = gate_up[t * 2 * inter + c], u = gate_up[t * 2 * inter + inter + c];
  out[i] = gate_activation(g, gelu) * u;
}

__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ o, const float* __restrict__ w,
                                    float* __restrict__ y, int width, float eps, float* __restrict__ copy,
                                    int64_t copy_stride) {
  pdl_wait();
  pdl_trigger();
  float* xr = x + static_cast<int64_t>(blockIdx.x) * width;
  const float* orow = o + static_cast<int64_t>(blockIdx.x) * width;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * width;
  float* cr = copy != nullptr ? copy + static_cast<int64_t>(blockIdx.x) * copy_stride : nullptr;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const float v = xr[i] + orow[i];
    xr[i] = v;
    if (cr != nullptr) cr[i] = v;
    sum += v * v;
  }
  const float inv = rsqrtf(block_sum(sum) / static_cast<float>(width) + eps);
  // Each thread reads back only what it wrote itself.
  for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

// The same for rows of width4 float4s held in registers, kVecs a thread: the norm's weights are
// read before the wait (they do not depend on the previous kernel, so their latency overlaps its
// tail), and x + o is read once, kept, and read back from registers, not memory: one memory round
// trip after the wait instead of three. Its sums run in another order than the general loop's, so
// a row's bits depend on which kernel takes it; that choice depends only on the width and the
// buffers' alignment, which are fixed for a model, so a model's output does not change with it.
template <int kVecs>
__global__ void __launch_bounds__(1024) add_rms_norm_vec_kernel(float4* __restrict__ x, const float4* __restrict__ o,
                                        const float4* __restrict__ w, float4* __restrict__ y, int width4, float eps,
                                        float4* __restrict__ copy, int64_t copy_stride4) {
  const int64_t row = blockIdx.x;
  float4 g[kVecs], v[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    g[k] = i < width4 ? w[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_wait();
  pdl_trigger();
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (i >= width4) continue;
    const float4 a = x[row * width4 + i], b = o[row * width4 + i];
    v[k] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    x[row * width4 + i] = v[k];
    if (copy != nullptr) copy[row * copy_stride4 + i] = v[k];
    sum += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float inv = rsqrtf(block_sum(sum) / static_cast<float>(4 * width4) + eps);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (i >= width4) continue;
    y[row * width4 + i] = make_float4(g[k].x * (v[k].x * inv), g[k].y * (v[k].y * inv), g[k].z * (v[k].z * inv),
                                      g[k].w * (v[k].w * inv));
  }
}

}  // namespace

void qkv_epilogue(const QkvEpilogueParams& p, cudaStream_t s) {
  SPECULA_REQUIRE(p.head_dim % 2 == 0 && p.head_dim <= kMaxHeadDim,
                  "qkv_epilogue: head_dim " + std::to_string(p.head_dim) + " is not supported; it must be even and <= 256");
  SPECULA_REQUIRE(p.k_cache == nullptr || p.cache_dtype == kBF16 || p.cache_dtype == kFp8E4m3,
                  "qkv_epilogue: cache dtype code " + std::to_string(p.cache_dtype) + " is not supported; bf16 or fp8_e4m3");
  SPECULA_REQUIRE(p.dca_chunk_len > 0 ? (p.q_variants == 3 || p.q_variants == 5) : p.q_variants == 1,
                  "qkv_epilogue: " + std::to_string(p.q_variants) + " q variants with dual chunk length " +
                      std::to_string(p.dca_chunk_len) + "; dual chunk attention takes 3 or 5, plain attention 1");
  const int64_t items = p.n * (p.num_q_heads + 2 * p.num_kv_heads);
  if (items == 0) return;
  launch_pdl(qkv_epilogue_kernel, static_cast<unsigned>((items + kEpilogueWarps - 1) / kEpilogueWarps),
             kEpilogueWarps * 32, 0, s, p);
  CUDA_CHECK(cudaGetLastError());
}

void gated_activation_fused(const float* gate_up, float* out, int64_t n, int inter, bool gelu, cudaStream_t s) {
  const int64_t count = n * inter;
  if (count == 0) return;
  launch_pdl(gated_fused_kernel, static_cast<unsigned>((count + kThreads - 1) / kThreads), kThreads, 0, s, gate_up,
             out, n, inter, gelu);
  CUDA_CHECK(cudaGetLastError());
}

void add_rms_norm_rows(float* x, const float* o, const float* w, float* y, int64_t rows, int width, float eps,
                       cudaStream_t s, float* copy, int64_t copy_stride) {
  if (rows == 0) return;
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const int width4 = width / 4;
  // A thread a float4 up to 1024 threads, then two or four.
  const int threads = std::min(1024, std::max(32, (width4 + 31) / 32 * 32));
  const int vecs = (width4 + threads - 1) / threads;
  if (width % 4 == 0 && vecs <= 4 && aligned(x) && aligned(o) && aligned(w) && aligned(y) &&
      (copy == nullptr || (aligned(copy) && copy_stride % 4 == 0))) {
    auto* x4 = reinterpret_cast<float4*>(x);
    const auto* o4 = reinterpret_cast<const float4*>(o);
    const auto* w4 = reinterpret_cast<const float4*>(w);
    auto* y4 = reinterpret_cast<float4*>(y);
    auto* c4 = reinterpret_cast<float4*>(copy);
    const auto go = [&](auto kernel) {
      launch_pdl(kernel, static_cast<unsigned>(rows), threads, 0, s, x4, o4, w4, y4, width4, eps, c4, copy_stride / 4);
    };
    if (vecs == 1) go(add_rms_norm_vec_kernel<1>);
    else if (vecs == 2) go(add_rms_norm_vec_kernel<2>);
    else go(add_rms_norm_vec_kernel<4>);
  } else {
    launch_pdl(add_rms_norm_kernel, static_cast<unsigned>(rows), row_threads(width), 0, s, x, o, w, y, width, eps,
               copy, copy_stride);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
