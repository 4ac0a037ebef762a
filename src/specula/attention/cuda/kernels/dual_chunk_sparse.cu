#include "specula/attention/cuda/kernels/dual_chunk_sparse.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "specula/core/convert.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/dtype_codes.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = kSparseKeyBlock;
constexpr int kSlice = 32;  // head_dim elements staged at a time
constexpr int kSelectThreads = 1024;
constexpr float kNegInf = -__builtin_huge_valf();

__device__ __forceinline__ float load_elem(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case kFp8E4m3: return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The scores of key j (this thread's) for every estimating query: s[e], -inf where j is past
// query e's position or past the run.
__device__ __forceinline__ void score_key(const DualChunkSparseParams& p, const int32_t* run, int head, int j,
                                          float (&s)[kMaxSparseEstimators]) {
  __shared__ float qs[kMaxSparseEstimators][3][kSlice];
  const int D = p.head_dim, count = run[kRunCount], end = run[kRunEnd], chunk = run[kRunChunk];
  const bool active = j < end;
  const int kh = head / (p.num_q_heads / p.num_kv_heads);
  const int key_chunk = (active ? j : 0) / p.chunk_len;
  const int variant = key_chunk == chunk ? 0 : key_chunk == chunk - 1 ? 1 : 2;  // of variants 0, 3, 4
  int64_t krow = 0;
  if (active) {
    const int64_t slot = static_cast<int64_t>(p.pages[static_cast<int64_t>(run[kRunPageRow]) * p.page_stride + j / p.page_size]) *
                             p.page_size + j % p.page_size;
    krow = (slot * p.num_kv_heads + kh) * D;
  }
#pragma unroll
  for (int e = 0; e < kMaxSparseEstimators; ++e) s[e] = 0.0f;
  for (int d0 = 0; d0 < D; d0 += kSlice) {
    __syncthreads();
    for (int i = threadIdx.x; i < count * 3 * kSlice; i += blockDim.x) {
      const int e = i / (3 * kSlice), v = (i / kSlice) % 3, d = i % kSlice;
      const int64_t at = static_cast<int64_t>(run[kRunToken] + e) * p.q_stride_token + head * p.q_stride_head +
                         (v == 0 ? 0 : v + 2) * D + d0 + d;
      qs[e][v][d] = d0 + d < D ? load_elem(p.q, p.q_dtype, at) : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    float k[kSlice];
    if ((p.kv_dtype == kBF16 || p.kv_dtype == kF16) && d0 + kSlice <= D) {
      // Four 16-byte loads (rows and slices are 16-byte aligned: head_dim is a multiple of 8).
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.k_cache) + krow + d0);
#pragma unroll
      for (int c = 0; c < kSlice / 8; ++c) {
        const uint4 raw = src[c];
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint16_t lo = static_cast<uint16_t>(words[w] & 0xffffu), hi = static_cast<uint16_t>(words[w] >> 16);
          if (p.kv_dtype == kBF16) {
            k[c * 8 + 2 * w] = __bfloat162float(__ushort_as_bfloat16(lo));
            k[c * 8 + 2 * w + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
          } else {
            k[c * 8 + 2 * w] = __half2float(__ushort_as_half(lo));
            k[c * 8 + 2 * w + 1] = __half2float(__ushort_as_half(hi));
          }
        }
      }
    } else {
#pragma unroll
      for (int d = 0; d < kSlice; ++d) k[d] = d0 + d < D ? load_elem(p.k_cache, p.kv_dtype, krow + d0 + d) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kMaxSparseEstimators; ++e) {
      if (e >= count) break;
      float acc = 0.0f;
#pragma unroll
      for (int d = 0; d < kSlice; ++d) acc += qs[e][variant][d] * k[d];
      s[e] += acc;
    }
  }
  const float mul = p.scale * p.temperature[blockIdx.z] * p.k_descale;
  const int first = run[kRunFirstPos];
#pragma unroll
  for (int e = 0; e < kMaxSparseEstimators; ++e) {
    float v = s[e] * mul;
    if (p.logit_cap > 0.0f) v = p.logit_cap * tanhf(v / p.logit_cap);
    s[e] = active && e < count && j <= first + e ? v : kNegInf;
  }
}

__host__ __device__ inline int64_t key_blocks(int max_end) { return (max_end + kThreads - 1) / kThreads; }

// grid (key blocks, heads, runs): each block's (max, sum of exp) per estimating query.
__global__ void __launch_bounds__(kThreads) partial_lse_kernel(const DualChunkSparseParams p) {
  const int32_t* run = p.runs + static_cast<int64_t>(blockIdx.z) * kSparseRunFields;
  const int head = blockIdx.y, kb = blockIdx.x;
  if (kb * kThreads >= run[kRunEnd]) return;
  float s[kMaxSparseEstimators];
  score_key(p, run, head, kb * kThreads + threadIdx.x, s);
  __shared__ float wm[kThreads / 32][kMaxSparseEstimators], wl[kThreads / 32][kMaxSparseEstimators];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, count = run[kRunCount];
#pragma unroll
  for (int e = 0; e < kMaxSparseEstimators; ++e) {
    if (e >= count) break;
    const float m = warp_max(s[e]);
    const float l = warp_sum(m == kNegInf ? 0.0f : expf(s[e] - m));
    if (lane == 0) {
      wm[warp][e] = m;
      wl[warp][e] = l;
    }
  }
  __syncthreads();
  if (threadIdx.x >= count) return;
  const int e = threadIdx.x;
  float m = kNegInf;
  for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, wm[w][e]);
  float l = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) l += wm[w][e] == kNegInf ? 0.0f : wl[w][e] * expf(wm[w][e] - m);
  float* out = p.partial + (((static_cast<int64_t>(blockIdx.z) * p.num_q_heads + head) * key_blocks(p.max_end) + kb) *
                                kMaxSparseEstimators + e) * 2;
  out[0] = m;
  out[1] = l;
}

// grid (heads, runs), one thread per estimating query: the key blocks' partials merged.
__global__ void merge_lse_kernel(const DualChunkSparseParams p) {
  const int32_t* run = p.runs + static_cast<int64_t>(blockIdx.y) * kSparseRunFields;
  const int e = threadIdx.x;
  if (e >= run[kRunCount]) return;
  const int64_t rh = static_cast<int64_t>(blockIdx.y) * p.num_q_heads + blockIdx.x;
  const int blocks = (run[kRunEnd] + kThreads - 1) / kThreads;
  float m = kNegInf, l = 0.0f;
  for (int kb = 0; kb < blocks; ++kb) {
    const float* in = p.partial + ((rh * key_blocks(p.max_end) + kb) * kMaxSparseEstimators + e) * 2;
    if (in[0] == kNegInf) continue;
    const float nm = fmaxf(m, in[0]);
    l = (m == kNegInf ? 0.0f : l * expf(m - nm)) + in[1] * expf(in[0] - nm);
    m = nm;
  }
  p.lse[rh * kMaxSparseEstimators + e] = m + logf(l);
}

// grid (key blocks, heads, runs): vertical[j] = sum over queries of their probability of key j;
// slash[d] += the probabilities at distance d (block sums in shared memory, then float atomics).
__global__ void __launch_bounds__(kThreads) scores_kernel(const DualChunkSparseParams p) {
  const int32_t* run = p.runs + static_cast<int64_t>(blockIdx.z) * kSparseRunFields;
  const int head = blockIdx.y, kb = blockIdx.x, end = run[kRunEnd], count = run[kRunCount];
  if (kb * kThreads >= end) return;
  const int j = kb * kThreads + threadIdx.x;
  float s[kMaxSparseEstimators];
  score_key(p, run, head, j, s);
  __shared__ float sums[kThreads + kMaxSparseEstimators];
  for (int i = threadIdx.x; i < kThreads + kMaxSparseEstimators; i += kThreads) sums[i] = 0.0f;
  __syncthreads();
  const int64_t rh = static_cast<int64_t>(blockIdx.z) * p.num_q_heads + head;
  const float* lse = p.lse + rh * kMaxSparseEstimators;
  float column = 0.0f;
#pragma unroll
  for (int e = 0; e < kMaxSparseEstimators; ++e) {
    if (e >= count) break;
    if (s[e] == kNegInf) continue;
    const float prob = expf(s[e] - lse[e]);
    column += prob;
    // Distance first + e - j, at index e + (kThreads - 1 - threadIdx.x) of this block's range.
    atomicAdd(&sums[e + kThreads - 1 - threadIdx.x], prob);
  }
  if (j < end) p.vertical[rh * p.max_end + j] = column;
  __syncthreads();
  const int base = run[kRunFirstPos] - (kb * kThreads + kThreads - 1);  // the distance of index 0
  for (int i = threadIdx.x; i < kThreads + kMaxSparseEstimators; i += kThreads) {
    const int d = base + i;
    if (sums[i] != 0.0f && d >= 0 && d < end) atomicAdd(&p.slash[rh * p.max_end + d], sums[i]);
  }
}

// The ordering key of element i: its score (non-negative, +inf for the forced ones) above, the
// complement of its index below (the lower index ranks first among equal scores).
__device__ __forceinline__ uint64_t rank_key(const float* scores, int i, int forced) {
  const float score = scores[i];
  const uint32_t hi = i < forced ? 0x7f800000u : score > 0.0f ? __float_as_uint(score) : 0u;
  return (static_cast<uint64_t>(hi) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}

// grid (heads, runs, 2: columns, distances): the top `keep` elements as a bitmap, by an exact
// radix select of the keep-th largest key, eight bits at a time.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(const DualChunkSparseParams p) {
  const int32_t* run = p.runs + static_cast<int64_t>(blockIdx.y) * kSparseRunFields;
  const int head = blockIdx.x, n = run[kRunEnd];
  const bool distances = blockIdx.z == 1;
  const int64_t rh = static_cast<int64_t>(blockIdx.y) * p.num_q_heads + head;
  const float* scores = (distances ? p.slash : p.vertical) + rh * p.max_end;
  const int keep = distances ? p.keep_slash[head] : p.keep_vertical[head];
  const int forced = distances ? p.forced_slash : p.forced_vertical;
  const int64_t words = (static_cast<int64_t>(p.max_end) + 31) / 32;  // keep_words, on the device
  uint32_t* bits = (distances ? p.keep_dists : p.keep_cols) + rh * words;
  __shared__ uint32_t hist[256];
  __shared__ uint64_t prefix_s, mask_s;
  __shared__ int remaining_s;
  uint64_t threshold = 0;  // keep keys >= threshold (0 with keep >= n: all)
  if (keep <= 0) {
    threshold = ~uint64_t{0};
  } else if (keep < n) {
    if (threadIdx.x == 0) {
      prefix_s = 0;
      mask_s = 0;
      remaining_s = keep;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint64_t prefix = prefix_s, mask = mask_s;
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const uint64_t key = rank_key(scores, i, forced);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int left = remaining_s;
        int bin = 255;
        for (; bin > 0; --bin) {
          if (static_cast<int>(hist[bin]) >= left) break;
          left -= static_cast<int>(hist[bin]);
        }
        remaining_s = left;
        prefix_s = prefix | (static_cast<uint64_t>(bin) << shift);
        mask_s = mask | (uint64_t{255} << shift);
      }
      __syncthreads();
    }
    threshold = prefix_s;
  }
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
    uint32_t word = 0;
    for (int b = 0; b < 32; ++b) {
      const int64_t i = w * 32 + b;
      if (i < n && rank_key(scores, static_cast<int>(i), forced) >= threshold) word |= 1u << b;
    }
    bits[w] = word;
  }
}

}  // namespace

void dual_chunk_sparse_workspace(int num_runs, int num_q_heads, int max_end, int64_t& partial, int64_t& lse,
                                 int64_t& scores) {
  const int64_t rh = static_cast<int64_t>(num_runs) * num_q_heads;
  partial = rh * key_blocks(max_end) * kMaxSparseEstimators * 2;
  lse = rh * kMaxSparseEstimators;
  scores = rh * max_end;
}

void launch_dual_chunk_sparse_select(const DualChunkSparseParams& p, cudaStream_t stream) {
  if (p.num_runs == 0) return;
  SPECULA_REQUIRE(p.q_dtype == kBF16 || p.q_dtype == kF16,
                  "dual chunk sparse: query dtype code " + std::to_string(p.q_dtype) + " is not supported");
  SPECULA_REQUIRE(p.chunk_len > 0 && p.max_end > 0, "dual chunk sparse: chunk_len and max_end must be positive");
  const dim3 score_grid(static_cast<unsigned>(key_blocks(p.max_end)), static_cast<unsigned>(p.num_q_heads),
                        static_cast<unsigned>(p.num_runs));
  partial_lse_kernel<<<score_grid, kThreads, 0, stream>>>(p);
  merge_lse_kernel<<<dim3(static_cast<unsigned>(p.num_q_heads), static_cast<unsigned>(p.num_runs)),
                     kMaxSparseEstimators, 0, stream>>>(p);
  CUDA_CHECK(cudaMemsetAsync(p.slash, 0, static_cast<size_t>(p.num_runs) * p.num_q_heads * p.max_end * sizeof(float),
                             stream));
  scores_kernel<<<score_grid, kThreads, 0, stream>>>(p);
  select_kernel<<<dim3(static_cast<unsigned>(p.num_q_heads), static_cast<unsigned>(p.num_runs), 2), kSelectThreads, 0,
                  stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
