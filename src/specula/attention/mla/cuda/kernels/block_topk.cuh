// Exact top-k of one row of f32 scores by one 1024-thread block (the lightning indexer's
// selection; usable for any per-row top-k whose row lies in global memory):
//   out[0, min(topk, n)) = the best positions of row[0, n), best first, ties to the lower
//   position; out[min(topk, n), topk) = -1.
//
// Scores map to u32 keys that order like the floats (NaN ranks as -inf, -0 as +0: the order of
// the CPU oracle's comparator). A radix select over 11/11/10-bit digits finds the topk-th largest
// key: the first digit's histogram covers the whole row (one read); if its threshold bin holds at
// most kCandidates entries they are compacted to shared memory in position order (a second read)
// and the later digits run there, otherwise the later digits re-read the row. A final ordered
// pass takes every entry above the threshold key and the lowest positions equal to it, and a
// bitonic sort of (key << 32 | ~position) orders the chosen entries best first.
//
// Cost per row of n scores: 2 reads of the row in the common case (3-4 when the first digit's
// threshold bin is wide), histogram atomics aggregated per warp (match.any), ~3 barriers per
// 4096 scores in the ordered passes, and a bitonic sort of next_pow2(topk) entries.
//
// Only CUDA built-ins are used (no headers), so the logic can be exercised on the host by an
// emulation of the block primitives.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specula::cuda_kernels::block_topk {

// ---- traits -------------------------------------------------------------------------------------

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 4;  // consecutive scores per thread per pass step (one float4)
constexpr int kChunk = kThreads * kItems;
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kCandidates = 4096;
constexpr uint32_t kNoBin = 0xffffffffu;
static_assert(kBins == 2 * kThreads && kWarps == 32);

struct Smem {
  uint32_t hist[kBins];
  uint32_t cand_key[kCandidates];  // the first digit's threshold bin, in position order
  int32_t cand_pos[kCandidates];
  uint32_t warp_sums[kWarps];
  uint32_t threshold_bin;
  uint32_t threshold_above;
  uint32_t sel_cursor;  // entries above the threshold written so far
  uint32_t pad;
};
static_assert(sizeof(Smem) % 16 == 0);
// Followed in shared memory by uint64_t sel[next_pow2(topk)] (smem_bytes).

// Bytes of shared memory run() needs for a given topk (dynamic shared memory of the caller).
inline size_t smem_bytes(int topk) {
  size_t size = 1;
  while (size < static_cast<size_t>(topk)) size <<= 1;
  return sizeof(Smem) + size * sizeof(uint64_t);
}

// ---- device helpers -----------------------------------------------------------------------------

// A u32 whose unsigned order is the float order; NaN ranks as -inf and -0 as +0, matching the
// CPU oracle's comparator (where NaN is -inf and -0 == +0).
__device__ __forceinline__ uint32_t score_key(float x) {
  if (x != x) x = -__int_as_float(0x7f800000);  // NaN
  if (x == 0.0f) x = 0.0f;
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// Sort key of a chosen entry: descending order = best score first, then the lower position.
// Never 0 (the smallest real key is -inf's, 0x007fffff), so 0 pads the sort.
__device__ __forceinline__ uint64_t entry(uint32_t key, int32_t pos) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(pos));
}

// The scores of one token in global memory; element i is position i.
struct RowSource {
  const float* row;
  int n;
  __device__ __forceinline__ void load(int i0, uint32_t (&key)[kItems], bool (&valid)[kItems]) const {
    if (i0 + kItems <= n) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(row + i0));  // rows and i0 are 16-byte aligned
      key[0] = score_key(v.x), key[1] = score_key(v.y), key[2] = score_key(v.z), key[3] = score_key(v.w);
#pragma unroll
      for (int q = 0; q < kItems; ++q) valid[q] = true;
    } else {
#pragma unroll
      for (int q = 0; q < kItems; ++q) {
        valid[q] = i0 + q < n;
        key[q] = valid[q] ? score_key(row[i0 + q]) : 0u;
      }
    }
  }
  __device__ __forceinline__ int32_t position(int i) const { return i; }
};

// Candidates compacted into shared memory, in position order.
struct CandidateSource {
  const uint32_t* keys;
  const int32_t* positions;
  int n;
  __device__ __forceinline__ void load(int i0, uint32_t (&key)[kItems], bool (&valid)[kItems]) const {
#pragma unroll
    for (int q = 0; q < kItems; ++q) {
      valid[q] = i0 + q < n;
      key[q] = valid[q] ? keys[i0 + q] : 0u;
    }
  }
  __device__ __forceinline__ int32_t position(int i) const { return positions[i]; }
};

// Exclusive prefix sum over the block (thread order) of v; total gets the block's sum.
__device__ __forceinline__ uint32_t block_exclusive_sum(uint32_t v, uint32_t* warp_sums, uint32_t& total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    uint32_t w = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  const uint32_t before = warp == 0 ? 0u : warp_sums[warp - 1];
  total = warp_sums[kWarps - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return before + incl - v;
}

// Adds the digit (key >> shift) & digit_mask of every entry whose key matches prefix under mask.
// Scores often share their top bits (one binade), so lanes of a warp mostly hit one bin: one
// atomic per distinct bin per warp (match.any) instead of 32 serialised ones.
template <class Source>
__device__ __forceinline__ void histogram(const Source& src, uint32_t mask, uint32_t prefix, int shift,
                                          uint32_t digit_mask, uint32_t* hist) {
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < src.n; base += kChunk) {  // same trip count in every lane: match.any needs all
    uint32_t key[kItems];
    bool valid[kItems];
    src.load(base + threadIdx.x * kItems, key, valid);
#pragma unroll
    for (int q = 0; q < kItems; ++q) {
      const bool in = valid[q] && (key[q] & mask) == prefix;
      const uint32_t bin = in ? (key[q] >> shift) & digit_mask : kNoBin;
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
    }
  }
}

// One radix digit: histogram the matching entries, find the bin holding the need-th largest, and
// narrow (mask, prefix) to it; need becomes the count still to take from that bin. Returns the
// bin's size (>= the new need).
template <class Source>
__device__ uint32_t radix_pass(const Source& src, Smem& s, uint32_t& mask, uint32_t& prefix, uint32_t& need,
                               int shift, int bits) {
  for (int i = threadIdx.x; i < kBins; i += kThreads) s.hist[i] = 0;
  __syncthreads();
  const uint32_t digit_mask = (1u << bits) - 1u;
  histogram(src, mask, prefix, shift, digit_mask, s.hist);
  __syncthreads();
  // Bins in descending order, two per thread; the exclusive sum counts the entries above them.
  const int d0 = kBins - 1 - 2 * static_cast<int>(threadIdx.x);
  const uint32_t h0 = s.hist[d0];
  const uint32_t h1 = s.hist[d0 - 1];
  uint32_t total = 0;
  const uint32_t above = block_exclusive_sum(h0 + h1, s.warp_sums, total);
  if (above < need && need <= above + h0) {
    s.threshold_bin = static_cast<uint32_t>(d0);
    s.threshold_above = above;
  } else if (above + h0 < need && need <= above + h0 + h1) {
    s.threshold_bin = static_cast<uint32_t>(d0 - 1);
    s.threshold_above = above + h0;
  }
  __syncthreads();
  const uint32_t bin = s.threshold_bin;
  const uint32_t count = s.hist[bin];
  need -= s.threshold_above;
  __syncthreads();  // everyone has read hist and the threshold before they are reused
  prefix |= bin << shift;
  mask |= digit_mask << shift;
  return count;
}

// The remaining digits (bits 20..10, then 9..0), stopping once the whole threshold bin is needed.
template <class Source>
__device__ void refine(const Source& src, Smem& s, uint32_t& mask, uint32_t& prefix, uint32_t& need) {
  if (radix_pass(src, s, mask, prefix, need, 10, 11) == need) return;
  radix_pass(src, s, mask, prefix, need, 0, 10);
}

// In position order: entries whose masked key is above prefix go to sel at an atomic cursor (their
// order does not matter, the sort follows); entries equal to it are ranked and the first `need`
// handed to take_tie(rank, key, position).
template <class Source, class TakeTie>
__device__ void gather(const Source& src, Smem& s, uint64_t* sel, uint32_t mask, uint32_t prefix, uint32_t need,
                       TakeTie take_tie) {
  uint32_t seen = 0;
  for (int base = 0; base < src.n; base += kChunk) {
    const int i0 = base + threadIdx.x * kItems;
    uint32_t key[kItems];
    bool valid[kItems];
    src.load(i0, key, valid);
    uint32_t ties = 0;
#pragma unroll
    for (int q = 0; q < kItems; ++q) {
      if (!valid[q]) continue;
      const uint32_t m = key[q] & mask;
      if (m > prefix) {
        sel[atomicAdd(&s.sel_cursor, 1u)] = entry(key[q], src.position(i0 + q));
      } else if (m == prefix) {
        ++ties;
      }
    }
    uint32_t total = 0;
    uint32_t rank = seen + block_exclusive_sum(ties, s.warp_sums, total);
#pragma unroll
    for (int q = 0; q < kItems; ++q) {
      if (valid[q] && (key[q] & mask) == prefix) {
        if (rank < need) take_tie(rank, key[q], src.position(i0 + q));
        ++rank;
      }
    }
    seen += total;
  }
}

// Chooses the k (< n) best entries of the row into sel[0, k) (unordered).
__device__ inline void select_top(const RowSource& row, uint32_t k, Smem& s, uint64_t* sel) {
  uint32_t mask = 0, prefix = 0, need = k;
  const uint32_t count = radix_pass(row, s, mask, prefix, need, 21, 11);
  // After the last pass, ties with the threshold key fill sel[k - need, k) by rank.
  const auto tie_to_sel = [&](uint32_t rank, uint32_t key, int32_t pos) { sel[k - need + rank] = entry(key, pos); };
  if (count == need) {
    gather(row, s, sel, mask, prefix, need, tie_to_sel);
    return;
  }
  if (count <= kCandidates) {
    const auto to_candidates = [&](uint32_t rank, uint32_t key, int32_t pos) {
      s.cand_key[rank] = key;
      s.cand_pos[rank] = pos;
    };
    gather(row, s, sel, mask, prefix, count, to_candidates);
    __syncthreads();
    const CandidateSource cand{s.cand_key, s.cand_pos, static_cast<int>(count)};
    refine(cand, s, mask, prefix, need);
    gather(cand, s, sel, mask, prefix, need, tie_to_sel);
    return;
  }
  refine(row, s, mask, prefix, need);
  gather(row, s, sel, mask, prefix, need, tie_to_sel);
}

// Sorts sel[0, size) descending (size a power of two) with a bitonic network.
__device__ inline void bitonic_sort_desc(uint64_t* sel, int size) {
  for (int span = 2; span <= size; span <<= 1) {
    for (int stride = span >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < size / 2; i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool descending = (lo & span) == 0;
        const uint64_t a = sel[lo];
        const uint64_t b = sel[hi];
        if ((a < b) == descending) {
          sel[lo] = b;
          sel[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// The whole selection for one row; every thread of the block calls it. smem: smem_bytes(topk)
// bytes, 16-byte aligned; row 16-byte aligned; 1 <= topk.
__device__ inline void run(const float* row, int n, int topk, unsigned char* smem, int32_t* out) {
  Smem& s = *reinterpret_cast<Smem*>(smem);
  uint64_t* sel = reinterpret_cast<uint64_t*>(smem + sizeof(Smem));
  n = n < 0 ? 0 : n;
  const int k = topk < n ? topk : n;
  if (threadIdx.x == 0) s.sel_cursor = 0;
  __syncthreads();
  if (n <= topk) {
    for (int i = threadIdx.x; i < n; i += kThreads) sel[i] = entry(score_key(row[i]), i);
  } else {
    select_top(RowSource{row, n}, static_cast<uint32_t>(k), s, sel);
  }
  int size = 1;
  while (size < k) size <<= 1;
  for (int i = k + threadIdx.x; i < size; i += kThreads) sel[i] = 0;
  __syncthreads();
  bitonic_sort_desc(sel, size);
  for (int i = threadIdx.x; i < topk; i += kThreads) {
    out[i] = i < k ? static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(sel[i])) : -1;
  }
}

}  // namespace specula::cuda_kernels::block_topk
