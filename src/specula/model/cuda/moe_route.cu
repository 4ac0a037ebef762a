// moe_route, moe_align and moe_combine (moe_kernels.h). The router follows the CPU reference's
// arithmetic (model/moe.cpp): scores computed in double and rounded to f32, selection ties to the
// lower index. The softmax denominator is summed in another order and the device's double exp is
// not glibc's; after the rounding to f32 that can only split an exact tie differently.
#include <cub/block/block_scan.cuh>

#include <cmath>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"
#include "specula/core/error.h"
#include "specula/model/cuda/moe_kernels.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kRouteWarps = 4;

// A candidate of a warp-wide arg-max: larger value first, ties to the lower index; idx < 0 is
// no candidate. Values are never NaN (candidate() makes NaN -inf), so the order is total and
// every round finds an expert.
struct Best {
  float value;
  int idx;
};

__device__ __forceinline__ bool better(Best a, Best b) {
  if (a.idx < 0) return false;
  if (b.idx < 0) return true;
  return a.value > b.value || (a.value == b.value && a.idx < b.idx);
}

// A NaN score (an overflowed activation) ranks last, as -inf: the token still takes valid experts
// and its output is NaN, as on the CPU, instead of an index of -1 reaching the sort.
__device__ __forceinline__ Best candidate(float value, int idx) { return Best{isnan(value) ? -INFINITY : value, idx}; }

__device__ __forceinline__ Best warp_best(Best b) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best o{__shfl_xor_sync(0xffffffffu, b.value, offset), __shfl_xor_sync(0xffffffffu, b.idx, offset)};
    if (better(o, b)) b = o;
  }
  return b;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// One warp per token. Shared memory: per warp, scores and choices [experts] and group values.
__global__ void route_kernel(MoeRouteParams p) {
  extern __shared__ float route_smem[];
  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= p.n) return;
  const int E = p.experts;
  float* score = route_smem + warp * (2 * E + kMaxRouteGroups);
  float* choice = score + E;
  float* group = choice + E;
  const float* logits = p.logits + t * E;
  if (p.sigmoid) {
    for (int e = lane; e < E; e += 32) score[e] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logits[e]))));
  } else {
    float top = -INFINITY;
    for (int e = lane; e < E; e += 32) top = fmaxf(top, logits[e]);
    top = warp_max(top);
    double z = 0;
    for (int e = lane; e < E; e += 32) z += exp(static_cast<double>(logits[e]) - top);
    z = warp_sum(z);
    for (int e = lane; e < E; e += 32) score[e] = static_cast<float>(exp(static_cast<double>(logits[e]) - top) / z);
  }
  for (int e = lane; e < E; e += 32) {
    choice[e] = p.bias != nullptr ? static_cast<float>(static_cast<double>(score[e]) + static_cast<double>(p.bias[e]))
                                  : score[e];
  }
  __syncwarp();
  if (p.method != 0) {
    const int per_group = E / p.groups;
    for (int g = lane; g < p.groups; g += 32) {
      float best = -INFINITY, second = -INFINITY;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        const float v = choice[e];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      group[g] = p.method == 2 ? static_cast<float>(static_cast<double>(best) + static_cast<double>(second)) : best;
    }
    __syncwarp();
    uint64_t kept = 0;  // groups <= kMaxRouteGroups
    for (int r = 0; r < p.top_groups; ++r) {
      Best b{0.0f, -1};
      for (int g = lane; g < p.groups; g += 32) {
        const Best c = candidate(group[g], g);
        if (!((kept >> g) & 1u) && better(c, b)) b = c;
      }
      b = warp_best(b);
      kept |= uint64_t{1} << b.idx;
    }
    for (int e = lane; e < E; e += 32) {
      if (!((kept >> (e / per_group)) & 1u)) choice[e] = -INFINITY;
    }
    __syncwarp();
  }
  // Lane l holds experts l, l + 32, ...: bit i of `taken` is expert l + 32 i. Lane r keeps the
  // r-th pick (top_k <= kMaxMoeTokenExperts = 32), so the weights need no read-back of the ids.
  const int stride = p.top_k + p.shared;
  uint32_t taken = 0;
  double sum = 0;
  int pick = -1;
  float pick_score = 0.0f;
  for (int r = 0; r < p.top_k; ++r) {
    Best b{0.0f, -1};
    for (int e = lane, i = 0; e < E; e += 32, ++i) {
      const Best c = candidate(choice[e], e);
      if (!((taken >> i) & 1u) && better(c, b)) b = c;
    }
    b = warp_best(b);
    if (b.idx % 32 == lane) taken |= 1u << (b.idx / 32);
    const float s = score[b.idx];
    sum += s;
    if (lane == r) {
      pick = b.idx;
      pick_score = s;
    }
  }
  if (lane < p.top_k) {
    double w = pick_score;
    if (p.normalise) w /= sum + 1e-20;
    if (!p.normalise || p.scale) w *= p.scaling_factor;
    p.ids[t * stride + lane] = pick;
    p.weights[t * stride + lane] = static_cast<float>(w);
  }
  for (int j = lane; j < p.shared; j += 32) {
    p.ids[t * stride + p.top_k + j] = E + j;
    p.weights[t * stride + p.top_k + j] = 1.0f;
  }
}

constexpr int kAlignThreads = 1024;

__global__ void __launch_bounds__(kAlignThreads) align_kernel(MoeAlignParams p) {
  using Scan = cub::BlockScan<int, kAlignThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int counts[kMaxRouteExperts], first_block[kMaxRouteExperts], cursor[kMaxRouteExperts];
  __shared__ int total;
  pdl_wait();
  pdl_trigger();
  const int tid = threadIdx.x, E = p.experts;
  for (int e = tid; e < E; e += kAlignThreads) counts[e] = cursor[e] = 0;
  __syncthreads();
  for (int64_t i = tid; i < p.pairs; i += kAlignThreads) atomicAdd(&counts[p.ids[i]], 1);
  __syncthreads();
  const int blocks = tid < E ? (counts[tid] + p.block_m - 1) / p.block_m : 0;
  int first = 0, all = 0;
  Scan(scan_storage).ExclusiveSum(blocks, first, all);
  if (tid < E) first_block[tid] = first;
  if (tid == 0) {
    total = all;
    *p.num_blocks = all;
  }
  __syncthreads();
  for (int e = tid; e < E; e += kAlignThreads) {
    const int nb = (counts[e] + p.block_m - 1) / p.block_m;
    for (int b = 0; b < nb; ++b) p.block_expert[first_block[e] + b] = e;
  }
  for (int64_t r = tid; r < static_cast<int64_t>(total) * p.block_m; r += kAlignThreads) p.sorted[r] = -1;
  __syncthreads();
  for (int64_t i = tid; i < p.pairs; i += kAlignThreads) {
    const int e = p.ids[i];
    const int row = first_block[e] * p.block_m + atomicAdd(&cursor[e], 1);
    p.sorted[row] = static_cast<int32_t>(i);
    p.slot[i] = row;
  }
}

// Block (t, y): token t's columns [256 y, 256 y + 256), one per thread. (One block per token,
// its threads looping over the columns, took 13 us for one token of DeepSeek-V2-Lite's width on
// an H200: a chain of dependent loads in a single block.)
constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(MoeCombineParams p) {
  __shared__ int order[kMaxMoeTokenExperts];
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  // order: the token's pairs by expert index (the order the CPU adds its experts in); each of
  // the first top_k threads places its own pair by its rank.
  if (threadIdx.x < p.top_k) {
    const int32_t* ids = p.ids + t * p.top_k;
    const int j = static_cast<int>(threadIdx.x);
    int rank = 0;
    for (int i = 0; i < p.top_k; ++i) rank += ids[i] < ids[j] || (ids[i] == ids[j] && i < j);
    order[rank] = j;
  }
  __syncthreads();
  const int c = blockIdx.y * kCombineThreads + threadIdx.x;
  if (c >= p.hidden) return;
  float acc = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    const int64_t pair = t * p.top_k + order[j];
    acc = __fadd_rn(acc, __fmul_rn(p.weights[pair], p.y[static_cast<int64_t>(p.slot[pair]) * p.hidden + c]));
  }
  p.out[t * p.hidden + c] = acc;
}

}  // namespace

void moe_route(const MoeRouteParams& p, cudaStream_t s) {
  if (p.n == 0) return;
  SPECULA_CHECK(p.top_k + p.shared <= kMaxMoeTokenExperts,
                "moe_route on the GPU: top {} and {} shared experts per token (at most {} in all)", p.top_k, p.shared,
                kMaxMoeTokenExperts);
  SPECULA_CHECK(p.experts >= 1 && p.experts + p.shared <= kMaxRouteExperts && p.shared >= 0 && p.groups >= 1 &&
                    p.groups <= kMaxRouteGroups &&
                    p.experts % p.groups == 0 && p.top_k >= 1 && p.top_k <= p.experts && p.top_groups >= 1 &&
                    p.top_groups <= p.groups,
                "moe_route on the GPU: {} experts in {} groups keeping {}, top {}: supported are up to {} experts and {} groups",
                p.experts, p.groups, p.top_groups, p.top_k, kMaxRouteExperts, kMaxRouteGroups);
  const auto blocks = static_cast<unsigned>((p.n + kRouteWarps - 1) / kRouteWarps);
  const size_t smem = sizeof(float) * kRouteWarps * (2 * p.experts + kMaxRouteGroups);
  raise_dynamic_smem(route_kernel, sizeof(float) * kRouteWarps * (2 * kMaxRouteExperts + kMaxRouteGroups));
  launch_pdl(route_kernel, blocks, kRouteWarps * 32, smem, s, p);
  CUDA_CHECK(cudaGetLastError());
}

void moe_align(const MoeAlignParams& p, cudaStream_t s) {
  SPECULA_CHECK(p.experts >= 1 && p.experts <= kMaxRouteExperts && p.block_m >= 1, "moe_align: {} experts (at most {})",
                p.experts, kMaxRouteExperts);
  launch_pdl(align_kernel, 1, kAlignThreads, 0, s, p);
  CUDA_CHECK(cudaGetLastError());
}

void moe_combine(const MoeCombineParams& p, cudaStream_t s) {
  if (p.n == 0) return;
  SPECULA_CHECK(p.top_k >= 1 && p.top_k <= kMaxMoeTokenExperts && p.hidden >= 1,
                "moe_combine: top {} (1 to {}) over {} columns (at least 1)", p.top_k, kMaxMoeTokenExperts, p.hidden);
  const dim3 grid(static_cast<unsigned>(p.n), static_cast<unsigned>((p.hidden + kCombineThreads - 1) / kCombineThreads));
  launch_pdl(combine_kernel, grid, kCombineThreads, 0, s, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
