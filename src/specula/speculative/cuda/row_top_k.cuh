// Deterministic top-k selection for the EAGLE draft kernels (draft_kernels.cu): each thread
// keeps a sorted top-KCAP list in registers (KCAP = k rounded up to a power of two, so the list is
// fully unrolled and never touches local memory), each warp extracts its best k by k rounds of a
// shuffle arg-max, and warp 0 does the same over the warps' lists. The order is BetterScore's:
// higher value first, equal values to the lower index. It is a strict total order on distinct
// indices, so every lane of a butterfly agrees on the winner and the result does not depend on
// the thread count: the selection equals the CPU's partial_sort. row_top_k applies it to one
// row's softmax, as CpuDraftHead::top_k computes it.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "specula/core/score_order.cuh"

namespace specula::cuda_kernels {
namespace {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr int kTopKMaxThreads = 512;

// ---- selection helpers ------------------------------------------------------------------

// A sorted (best first) list of KCAP (value, index) pairs; empty entries are (-inf, INT_MAX),
// worse than any real entry.
template <int KCAP>
struct TopList {
  float v[KCAP];
  int32_t id[KCAP];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < KCAP; ++i) {
      v[i] = kNegInf;
      id[i] = INT_MAX;
    }
  }

  __device__ __forceinline__ void insert(float x, int32_t i) {
    if (!score_before(x, i, v[KCAP - 1], id[KCAP - 1])) return;
    v[KCAP - 1] = x;
    id[KCAP - 1] = i;
#pragma unroll
    for (int j = KCAP - 1; j > 0; --j) {
      if (score_before(v[j], id[j], v[j - 1], id[j - 1])) {
        const float tv = v[j];
        v[j] = v[j - 1];
        v[j - 1] = tv;
        const int32_t ti = id[j];
        id[j] = id[j - 1];
        id[j - 1] = ti;
      }
    }
  }

  __device__ __forceinline__ void pop_front() {
#pragma unroll
    for (int j = 0; j + 1 < KCAP; ++j) {
      v[j] = v[j + 1];
      id[j] = id[j + 1];
    }
    v[KCAP - 1] = kNegInf;
    id[KCAP - 1] = INT_MAX;
  }
};

// The warp's best k of its lanes' lists, best first, written by lane 0 to out_v/out_id[0..k).
// Indices are unique across lanes (each element lives in one list), so exactly one lane pops
// per round; only empty entries share INT_MAX, and popping those changes nothing.
template <int KCAP>
__device__ __forceinline__ void warp_select(TopList<KCAP>& list, int k, float* out_v, int32_t* out_id) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int round = 0; round < k; ++round) {
    float bv = list.v[0];
    int32_t bi = list.id[0];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (score_before(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (list.id[0] == bi) list.pop_front();
    if (lane == 0) {
      out_v[round] = bv;
      out_id[round] = bi;
    }
  }
}

// The block's best k (k <= KCAP) into out_v/out_id (shared memory), visible to every thread on
// return. blockDim.x must be a multiple of 32; sm_v/sm_id hold (blockDim.x / 32) * KCAP entries.
template <int KCAP>
__device__ void block_select(TopList<KCAP>& list, int k, float* sm_v, int32_t* sm_id, float* out_v, int32_t* out_id) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  warp_select(list, k, sm_v + warp * KCAP, sm_id + warp * KCAP);
  __syncthreads();
  if (warp == 0) {
    TopList<KCAP> merged;
    merged.clear();
    if (lane < warps) {
#pragma unroll
      for (int i = 0; i < KCAP; ++i) {
        if (i < k) {
          merged.v[i] = sm_v[lane * KCAP + i];
          merged.id[i] = sm_id[lane * KCAP + i];
        }
      }
    }
    warp_select(merged, k, out_v, out_id);
  }
  __syncthreads();
}

// Block reductions in a fixed order (deterministic); sm holds 32 entries and may be reused
// right after return.
__device__ float block_max(float v, float* sm) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  float total = kNegInf;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total = fmaxf(total, sm[i]);
  __syncthreads();
  return total;
}

__device__ double block_sum(double v, double* sm) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total += sm[i];
  __syncthreads();
  return total;
}

// Runs f(std::integral_constant<int, KCAP>) for the smallest power of two KCAP >= k.
template <typename F>
void dispatch_kcap(int k, F&& f) {
  if (k <= 1) f(std::integral_constant<int, 1>{});
  else if (k <= 2) f(std::integral_constant<int, 2>{});
  else if (k <= 4) f(std::integral_constant<int, 4>{});
  else if (k <= 8) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 16>{});
}

// ---- draft_top_k ------------------------------------------------------------------------

// The k best softmax probabilities of one row (best_v, as draft ids in best_id; shared memory,
// visible to every thread on return), by the whole block: three passes over the row (the max,
// the sum, then p and the local lists); the later passes hit L2. p = float(double(e) / sum)
// with e = expf(l - max), as CpuDraftHead::top_k computes it, so equal logits give equal p and
// fall to the lower id. The sum is Kahan-compensated f32 per thread (f64 conversions cost more
// than the pass itself), f64 across threads; it depends on the thread count, which
// topk_threads() fixes per vocabulary size for every caller.
template <int KCAP>
struct RowTopKShared {
  float f[32];
  double d[32];
  float v[(kTopKMaxThreads / 32) * KCAP];
  int32_t id[(kTopKMaxThreads / 32) * KCAP];
  float best_v[KCAP];
  int32_t best_id[KCAP];
};

template <int KCAP>
__device__ void row_top_k(const float* logits, int vocab, int k, RowTopKShared<KCAP>& sm) {
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  float mx = kNegInf;
  for (int i = tid; i < vocab; i += nthreads) mx = fmaxf(mx, logits[i]);
  mx = block_max(mx, sm.f);
  float part = 0.0f, comp = 0.0f;
  for (int i = tid; i < vocab; i += nthreads) {
    const float y = expf(logits[i] - mx) - comp;
    const float t = part + y;
    comp = (t - part) - y;
    part = t;
  }
  const double sum = block_sum(static_cast<double>(part), sm.d);

  // Screen before the f64 division: e * inv_sum is within a few ulps (or a subnormal step) of
  // the exact p, so an element clearly below the list's last entry cannot enter it. The margin
  // (1e-5 relative, 1e-44 absolute) is far wider than that error; an empty last entry (-inf)
  // lets everything through.
  const float inv_sum = static_cast<float>(1.0 / sum);
  TopList<KCAP> list;
  list.clear();
  for (int i = tid; i < vocab; i += nthreads) {
    const float e = expf(logits[i] - mx);
    if (e * inv_sum < list.v[KCAP - 1] * 0.99999f - 1e-44f) continue;
    list.insert(static_cast<float>(static_cast<double>(e) / sum), i);
  }
  block_select(list, k, sm.v, sm.id, sm.best_v, sm.best_id);
}

// Wide rows get more threads so one row is not a long serial loop; narrow ones fewer, so that
// the merge does not dominate.
inline int topk_threads(int vocab) { return vocab >= 8192 ? kTopKMaxThreads : (vocab >= 1024 ? 256 : 128); }

// A selected draft id as a target id. INT_MAX is the empty entry a row with nothing above -inf
// (or only NaN) selects; it becomes id 0, a valid token the verify then judges, instead of an
// index past the vocabulary.
__device__ __forceinline__ int32_t target_id(const int64_t* d2t, int32_t id) {
  if (id == INT_MAX) return 0;
  return static_cast<int32_t>(d2t != nullptr ? id + d2t[id] : id);
}

}  // namespace
}  // namespace specula::cuda_kernels
