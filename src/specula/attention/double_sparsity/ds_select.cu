// Double sparsity's choice of heavy tokens (select_heavy_tokens, ds_device.cuh): the label scores
// and an exact top-k in one kernel. A row (request, KV head) is one cluster of kCluster blocks
// (select_plan: 8 for small batches, so that one request still spreads over 8 x kv_heads
// multiprocessors; 4 or 2 when rows are many). Block r scores its 1/kCluster of the row's positions
// into its shared memory as ordered keys (into p.scores when they are more than kCachedKeys); the
// blocks then agree on the threshold through each other's shared memory (distributed shared
// memory):
//  1. the row's least and greatest finite scores;
//  2. a histogram of kBins bins linear between them, summed over the cluster, names the bin that
//     holds the k-th largest score. Linear bins spread a row's scores; bins over a float's top bits
//     (sign, exponent, two mantissa bits) put most of them into a handful, where shared-memory
//     atomics serialise, which made the earlier radix top-k the slowest part of a sparse step;
//  3. that bin's keys, a few dozen normally, are gathered into every block and ranked directly;
//     when there are too many (ties, rows whose scores barely differ) three radix passes over the
//     key bits, restricted to the bin, find it instead;
//  4. each block writes the cache rows of its chosen positions at the offset the blocks before it
//     fill, so the row's list is in position order.
// A key is chosen when it is above the threshold key T, or equal to it and among the first
// `remaining` such positions (ties to the lower position).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "specula/attention/double_sparsity/ds_device.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_smem.h"

namespace specula::ds_cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kMaxCluster = 8;       // blocks per row, at most
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;
constexpr int kCachedKeys = 16384;   // keys a block keeps in shared memory (64 KiB)
constexpr int kCachedSlots = 8192;   // and their cache rows, when it has no more keys than this
constexpr int kListCap = 256;        // the threshold bin's keys one block lists
constexpr int kGatherCap = 1024;     // the most keys ranked directly

struct Candidate {
  uint32_t key;
  int32_t position;
};

// Fields marked "peers" are read by the cluster's other blocks.
struct Shared {
  int hist[2][kBins];  // peers
  int total[kBins];
  Candidate list[kListCap];  // peers
  Candidate gathered[kGatherCap];
  float q_label[kMaxLabelChannels];
  float warp_lo[kWarps], warp_hi[kWarps];
  float block_lo, block_hi;  // peers
  float row_lo, row_scale;
  int list_count;  // peers
  int counts[2];   // keys above and equal to the threshold; peers
  int warp_above[kWarps], warp_equal[kWarps], warp_sums[kWarps];
  int warp_written[kWarps], warp_equal_before[kWarps];
  int rank_count[kMaxCluster], rank_offset[kMaxCluster];
  int gather_total;  // -1: too many to rank directly
  int found_bin, found_remaining;
  uint32_t threshold;
  int threshold_remaining;
};

// The bin of a key among kBins linear between lo and lo + (kBins - 1) / scale; monotone in the key's
// order, so a larger key never lands in a lower bin. Infinities and NaNs go to the end bins their
// keys' order puts them at; scale 0 puts every finite key in bin 0.
__device__ __forceinline__ int linear_bin(uint32_t key, float lo, float scale) {
  const float f = key_float(key);
  if (isnan(f)) return (key & 0x80000000u) ? kBins - 1 : 0;
  if (isinf(f)) return f > 0.0f ? kBins - 1 : 0;
  return static_cast<int>(fminf(fmaxf(floorf((f - lo) * scale), 0.0f), static_cast<float>(kBins - 1)));
}

// The bin (of `bins`, the highest first) that holds the `remaining`-th largest of the keys `total`
// counts, and how many of that bin's keys are then taken; every thread of the block calls it, and
// one writes the answer. Thread t sums bins/kThreads bins from the top, then a block-wide scan.
// Needs 1 <= remaining <= the sum.
__device__ void find_bin(const int* total, int bins, int remaining, int* warp_sums, int* bin_out, int* remaining_out) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int width = bins / kThreads, top = bins - tid * width;
  int sum = 0;
  for (int i = top - 1; i >= top - width; --i) sum += total[i];
  int inclusive = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += n;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  for (int w = 0; w < warp; ++w) inclusive += warp_sums[w];
  const int before = inclusive - sum;
  if (before < remaining && inclusive >= remaining) {
    int above = before, bin = top - 1;
    for (; bin > top - width; --bin) {
      if (above + total[bin] >= remaining) break;
      above += total[bin];
    }
    *bin_out = bin;
    *remaining_out = remaining - above;
  }
  __syncthreads();
}

// total[i] = the cluster's sum of hist[buffer][i], i < bins; every peer load is issued before the
// first sum, so the distributed shared-memory latency is paid about once.
template <int kCluster>
__device__ __forceinline__ void sum_over_cluster(cg::cluster_group& cluster, Shared& sh, int buffer, int bins) {
  constexpr int kPerThread = kBins / kThreads;
  const int* peer[kCluster];
#pragma unroll
  for (int r = 0; r < kCluster; ++r) peer[r] = cluster.map_shared_rank(sh.hist[buffer], r);
  int v[kPerThread][kCluster];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int bin = static_cast<int>(threadIdx.x) + k * kThreads;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) v[k][r] = bin < bins ? peer[r][bin] : 0;
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int bin = static_cast<int>(threadIdx.x) + k * kThreads;
    int sum = 0;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) sum += v[k][r];
    if (bin < bins) sh.total[bin] = sum;
  }
}

// The label scores of kBatch positions (their label rows at lab[u]); their loads are issued together.
template <typename T, int kBatch>
__device__ __forceinline__ void label_scores(const T* const* lab, const float* q_label, int C, float* s) {
#pragma unroll
  for (int u = 0; u < kBatch; ++u) s[u] = 0.0f;
  if (C % 8 == 0) {
    for (int c0 = 0; c0 < C; c0 += 8) {
      uint4 raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) raw[u] = *reinterpret_cast<const uint4*>(lab[u] + c0);
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const T* v = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int e = 0; e < 8; ++e) s[u] += q_label[c0 + e] * to_float(v[e]);
      }
    }
  } else {
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) s[u] += q_label[c] * to_float(lab[u][c]);
    }
  }
}

// Two blocks per multiprocessor (64 registers a thread) so that large batches, many clusters,
// overlap one cluster's barriers with another's work.
template <typename T, int kCluster>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 2)
    select_kernel(SparseDecode p, int cached_keys, bool cache_slots) {
  extern __shared__ uint32_t cached[];
  __shared__ Shared sh;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = static_cast<int>(blockIdx.x) / kCluster;
  const int b = row / p.kv_heads, h = row % p.kv_heads;
  const int len = p.kv_lens[b];
  // The whole cluster shares the row, so it leaves together.
  if (!row_is_sparse(len, p)) return;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int per = ((len + kCluster - 1) / kCluster + 31) / 32 * 32;
  const int lo = min(len, rank * per), n = min(len, lo + per) - lo;
  uint32_t* keys =
      cached_keys > 0 ? cached : reinterpret_cast<uint32_t*>(p.scores + static_cast<int64_t>(row) * p.max_kv_len) + lo;
  // The positions' cache rows, kept beside the keys when they fit (else looked up again at the end).
  int32_t* slots = cache_slots ? reinterpret_cast<int32_t*>(cached + cached_keys) : nullptr;

  const int G = p.q_heads / p.kv_heads, C = p.channels_per_head;
  const T* q = static_cast<const T*>(p.q) + (static_cast<int64_t>(b) * p.q_heads + h * G) * p.head_dim;
  for (int c = tid; c < C; c += kThreads) {
    const int channel = p.channels[h * C + c];
    float s = 0.0f;
    for (int g = 0; g < G; ++g) s += to_float(q[g * p.head_dim + channel]);
    sh.q_label[c] = s;
  }
  for (int i = tid; i < kBins; i += kThreads) sh.hist[0][i] = 0;
  if (tid == 0) sh.list_count = 0;
  __syncthreads();

  // 1. Scores, kBatch positions per thread at a time so that their page and label loads overlap,
  // and the block's least and greatest finite ones.
  constexpr int kBatch = 4;
  const T* labels = static_cast<const T*>(p.labels);
  float my_lo = INFINITY, my_hi = -INFINITY;
  for (int i0 = tid; i0 < n; i0 += kThreads * kBatch) {
    const T* lab[kBatch];
    int slot[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = min(i0 + u * kThreads, n - 1);  // past the end: a repeat, not stored
      slot[u] = slot_of(p, b, lo + i);
      lab[u] = labels + (static_cast<int64_t>(h) * p.label_slots + slot[u]) * C;
    }
    float s[kBatch];
    label_scores<T, kBatch>(lab, sh.q_label, C, s);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= n) break;
      keys[i] = order_key(s[u]);
      if (slots != nullptr) slots[i] = slot[u];
      if (isfinite(s[u])) {
        my_lo = fminf(my_lo, s[u]);
        my_hi = fmaxf(my_hi, s[u]);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    my_lo = fminf(my_lo, __shfl_xor_sync(0xffffffffu, my_lo, o));
    my_hi = fmaxf(my_hi, __shfl_xor_sync(0xffffffffu, my_hi, o));
  }
  if (lane == 0) {
    sh.warp_lo[warp] = my_lo;
    sh.warp_hi[warp] = my_hi;
  }
  __syncthreads();
  if (tid == 0) {
    float l = INFINITY, u = -INFINITY;
    for (int w = 0; w < kWarps; ++w) {
      l = fminf(l, sh.warp_lo[w]);
      u = fmaxf(u, sh.warp_hi[w]);
    }
    sh.block_lo = l;
    sh.block_hi = u;
  }
  cluster.sync();

  // 2. The row's range, the linear histogram, and the bin holding the k-th largest key.
  if (warp == 0) {
    float l = lane < kCluster ? *cluster.map_shared_rank(&sh.block_lo, lane) : INFINITY;
    float u = lane < kCluster ? *cluster.map_shared_rank(&sh.block_hi, lane) : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      l = fminf(l, __shfl_xor_sync(0xffffffffu, l, o));
      u = fmaxf(u, __shfl_xor_sync(0xffffffffu, u, o));
    }
    if (lane == 0) {
      float scale = u > l ? static_cast<float>(kBins - 1) / (u - l) : 0.0f;
      if (!isfinite(scale)) scale = 0.0f;
      sh.row_lo = scale > 0.0f ? l : 0.0f;
      sh.row_scale = scale;
    }
  }
  __syncthreads();
  const float row_lo = sh.row_lo, row_scale = sh.row_scale;
  for (int i = tid; i < n; i += kThreads) atomicAdd(&sh.hist[0][linear_bin(keys[i], row_lo, row_scale)], 1);
  cluster.sync();
  sum_over_cluster<kCluster>(cluster, sh, 0, kBins);
  for (int i = tid; i < kBins; i += kThreads) sh.hist[1][i] = 0;
  __syncthreads();
  find_bin(sh.total, kBins, p.heavy_token_num, sh.warp_sums, &sh.found_bin, &sh.found_remaining);
  const int bin = sh.found_bin;

  // 3. The threshold among the bin's keys.
  for (int i = tid; i < n; i += kThreads) {
    const uint32_t key = keys[i];
    if (linear_bin(key, row_lo, row_scale) == bin) {
      const int at = atomicAdd(&sh.list_count, 1);
      if (at < kListCap) sh.list[at] = Candidate{key, lo + i};
    }
  }
  cluster.sync();
  if (warp == 0) {
    const int c = lane < kCluster ? *cluster.map_shared_rank(&sh.list_count, lane) : 0;
    int inclusive = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int m = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += m;
    }
    const int all = __shfl_sync(0xffffffffu, inclusive, 31);
    const bool overflow = __any_sync(0xffffffffu, c > kListCap) || all > kGatherCap;
    if (lane < kCluster) {
      sh.rank_count[lane] = c;
      sh.rank_offset[lane] = inclusive - c;
    }
    if (lane == 0) sh.gather_total = overflow ? -1 : all;
  }
  __syncthreads();
  const int wanted = sh.found_remaining;
  if (sh.gather_total >= 0) {
    const int all = sh.gather_total;
    for (int r = 0; r < kCluster; ++r) {
      const Candidate* src = cluster.map_shared_rank(sh.list, r);
      for (int i = tid; i < sh.rank_count[r]; i += kThreads) sh.gathered[sh.rank_offset[r] + i] = src[i];
    }
    __syncthreads();
    // Candidate i is the threshold when exactly wanted - 1 of the bin's keys come before it.
    for (int i = tid; i < all; i += kThreads) {
      const Candidate me = sh.gathered[i];
      int before = 0, above = 0;
      for (int m = 0; m < all; ++m) {
        const Candidate o = sh.gathered[m];
        above += o.key > me.key;
        before += o.key > me.key || (o.key == me.key && o.position < me.position);
      }
      if (before == wanted - 1) {
        sh.threshold = me.key;
        sh.threshold_remaining = wanted - above;
      }
    }
  } else {
    // Radix passes over the key bits (11, 11, 10), the bin's keys only. The histograms alternate:
    // after its barrier a pass zeroes the other one, which the peers last read before that barrier.
    uint32_t prefix = 0, mask = 0;
    int remaining = wanted, buffer = 1;
    constexpr int kShift[3] = {21, 10, 0};
    constexpr int kBits[3] = {11, 11, 10};
#pragma unroll
    for (int pass = 0; pass < 3; ++pass) {
      const int bins = 1 << kBits[pass];
      for (int i = tid; i < n; i += kThreads) {
        const uint32_t key = keys[i];
        if ((key & mask) == prefix && linear_bin(key, row_lo, row_scale) == bin) {
          atomicAdd(&sh.hist[buffer][(key >> kShift[pass]) & (bins - 1)], 1);
        }
      }
      cluster.sync();
      sum_over_cluster<kCluster>(cluster, sh, buffer, bins);
      for (int i = tid; i < kBins; i += kThreads) sh.hist[buffer ^ 1][i] = 0;
      __syncthreads();
      find_bin(sh.total, bins, remaining, sh.warp_sums, &sh.found_bin, &sh.found_remaining);
      prefix |= static_cast<uint32_t>(sh.found_bin) << kShift[pass];
      mask |= static_cast<uint32_t>(bins - 1) << kShift[pass];
      remaining = sh.found_remaining;
      buffer ^= 1;
      __syncthreads();
    }
    if (tid == 0) {
      sh.threshold = prefix;
      sh.threshold_remaining = remaining;
    }
  }
  __syncthreads();
  const uint32_t threshold = sh.threshold;
  const int take_equal = sh.threshold_remaining;

  // 4. Counts per warp segment, per block, offsets over the cluster, then the writes.
  const int seg = ((n + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int wlo = min(n, warp * seg), whi = min(n, wlo + seg);
  int above_count = 0, equal_count = 0;
  for (int base = wlo; base < whi; base += 32) {
    const int i = base + lane;
    const uint32_t key = i < whi ? keys[i] : 0u;
    above_count += __popc(__ballot_sync(0xffffffffu, i < whi && key > threshold));
    equal_count += __popc(__ballot_sync(0xffffffffu, i < whi && key == threshold));
  }
  if (lane == 0) {
    sh.warp_above[warp] = above_count;
    sh.warp_equal[warp] = equal_count;
  }
  __syncthreads();
  if (tid == 0) {
    int a = 0, e = 0;
    for (int w = 0; w < kWarps; ++w) {
      a += sh.warp_above[w];
      e += sh.warp_equal[w];
    }
    sh.counts[0] = a;
    sh.counts[1] = e;
  }
  cluster.sync();
  if (warp == 0) {
    // Lane r < kCluster: block r's counts; lane w < kWarps then: this block's warp w. Equal keys
    // before a unit decide how many of its own are taken.
    const int above_r = lane < rank ? *cluster.map_shared_rank(&sh.counts[0], lane) : 0;
    const int equal_r = lane < rank ? *cluster.map_shared_rank(&sh.counts[1], lane) : 0;
    int eq_incl = equal_r;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int m = __shfl_up_sync(0xffffffffu, eq_incl, o);
      if (lane >= o) eq_incl += m;
    }
    const int taken_r = above_r + min(equal_r, max(0, take_equal - (eq_incl - equal_r)));
    int written_before = taken_r, equal_before = equal_r;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      written_before += __shfl_xor_sync(0xffffffffu, written_before, o);
      equal_before += __shfl_xor_sync(0xffffffffu, equal_before, o);
    }
    const int a = lane < kWarps ? sh.warp_above[lane] : 0;
    const int e = lane < kWarps ? sh.warp_equal[lane] : 0;
    int e_incl = e;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int m = __shfl_up_sync(0xffffffffu, e_incl, o);
      if (lane >= o) e_incl += m;
    }
    const int e_before = equal_before + e_incl - e;
    const int taken = a + min(e, max(0, take_equal - e_before));
    int t_incl = taken;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int m = __shfl_up_sync(0xffffffffu, t_incl, o);
      if (lane >= o) t_incl += m;
    }
    if (lane < kWarps) {
      sh.warp_written[lane] = written_before + t_incl - taken;
      sh.warp_equal_before[lane] = e_before;
    }
  }
  // The peers' counts are read: after this barrier no block reads another's shared memory, so
  // each may finish and leave.
  cluster.sync();
  int32_t* out = p.selected + static_cast<int64_t>(row) * p.heavy_token_num;
  int written = sh.warp_written[warp], equal_seen = sh.warp_equal_before[warp];
  const unsigned below_lane = (1u << lane) - 1u;
  // Without cached cache rows each lane looks its position's up unconditionally, so that the
  // loads of unrolled iterations are in flight together.
#pragma unroll 4
  for (int base = wlo; base < whi; base += 32) {
    const int i = base + lane;
    const int slot = slots != nullptr ? 0 : slot_of(p, b, lo + min(i, n - 1));
    const uint32_t key = i < whi ? keys[i] : 0u;
    const bool above = i < whi && key > threshold;
    const unsigned equal_mask = __ballot_sync(0xffffffffu, i < whi && key == threshold);
    const bool equal = (equal_mask >> lane) & 1u;
    const bool take = above || (equal && equal_seen + __popc(equal_mask & below_lane) < take_equal);
    const unsigned take_mask = __ballot_sync(0xffffffffu, take);
    if (take) out[written + __popc(take_mask & below_lane)] = slots != nullptr ? slots[i] : slot;
    written += __popc(take_mask);
    equal_seen += __popc(equal_mask);
  }
}

template <typename T, int kCluster>
void launch_cluster(const SparseDecode& p, const SelectPlan& plan, cudaStream_t stream) {
  // The most select_plan asks for: 16,384 keys alone, or 8,192 keys with their cache rows.
  raise_dynamic_smem(select_kernel<T, kCluster>,
                     std::max(kCachedKeys * sizeof(uint32_t), kCachedSlots * (sizeof(uint32_t) + sizeof(int32_t))));
  const auto blocks = static_cast<unsigned>(p.batch * p.kv_heads * kCluster);
  const size_t smem = static_cast<size_t>(plan.cached_keys) * (plan.cache_slots ? 8 : 4);
  select_kernel<T, kCluster><<<blocks, kThreads, smem, stream>>>(p, plan.cached_keys, plan.cache_slots);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch(const SparseDecode& p, cudaStream_t stream) {
  const SelectPlan plan = select_plan(p.batch * p.kv_heads, p.max_kv_len, p.num_sms);
  switch (plan.cluster) {
    case 2: launch_cluster<T, 2>(p, plan, stream); break;
    case 4: launch_cluster<T, 4>(p, plan, stream); break;
    default: launch_cluster<T, 8>(p, plan, stream); break;
  }
}

}  // namespace

SelectPlan select_plan(int rows, int max_kv_len, int num_sms) {
  auto per_block = [&](int cluster) { return ((max_kv_len + cluster - 1) / cluster + 31) / 32 * 32; };
  // The most blocks per row that still fit two per multiprocessor at once, and no fewer than
  // keep a block's cache rows in shared memory.
  int fill = 2;
  for (int c : {8, 4}) {
    if (static_cast<int64_t>(rows) * c <= 2 * static_cast<int64_t>(num_sms)) {
      fill = c;
      break;
    }
  }
  int fit = kMaxCluster;
  for (int c : {2, 4}) {
    if (per_block(c) <= kCachedSlots) {
      fit = c;
      break;
    }
  }
  SelectPlan plan;
  plan.cluster = std::max(fill, fit);
  const int per = per_block(plan.cluster);
  plan.cached_keys = per <= kCachedKeys ? per : 0;
  plan.cache_slots = per <= kCachedSlots;
  return plan;
}

void select_heavy_tokens(const SparseDecode& p, void* stream) {
  if (p.f16) launch<__half>(p, static_cast<cudaStream_t>(stream));
  else launch<__nv_bfloat16>(p, static_cast<cudaStream_t>(stream));
}

}  // namespace specula::ds_cuda
