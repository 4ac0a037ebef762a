// The split-KV decode kernel's block-level pieces: which query heads and keys a block serves, and
// the block's last step, which merges the partial softmax states of its warps held in shared
// memory and writes either the output (one split) or the split's partial result, merging all
// splits when it is the last block of its head group.
#pragma once

#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/io.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"

namespace specula::cuda_kernels {

// Splits are whole multiples of this many keys from the first visible key, so with page sizes of
// 16 or more and no window every 16-key tile lies in one page.
inline constexpr int kDecodeSplitAlign = 16;

struct DecodeBlock {
  int seq;
  int split;
  int kv_head;
  int head0;      // first query head
  int num_heads;  // <= heads per block
  int64_t token;  // query row of the sequence
  int begin;      // keys [begin, end) of this split; empty when begin >= end
  int end;
  int kv_len;     // the sequence's keys; the step's new one is the last
};

// Grid: (num_kv_heads x head_blocks, num_splits, num_seqs). Heads vary fastest so the blocks that
// read the interleaved rows of the same cache slots run side by side.
__device__ __forceinline__ DecodeBlock decode_block(const AttentionParams& p, const DecodeSplit& split,
                                                    int heads_per_block) {
  DecodeBlock b;
  b.seq = blockIdx.z;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int head_blocks = (group + heads_per_block - 1) / heads_per_block;
  b.split = blockIdx.y;
  b.kv_head = blockIdx.x / head_blocks;
  const int head_block = blockIdx.x % head_blocks;
  b.head0 = b.kv_head * group + head_block * heads_per_block;
  b.num_heads = min(heads_per_block, group - head_block * heads_per_block);
  b.token = p.cu_seqlens_q[b.seq];
  const int kv_len = p.seq_lens_k[b.seq];
  b.kv_len = kv_len;
  const int pos = kv_len - 1;
  int kv_start = 0;
  if (p.window_left >= 0) kv_start = max(0, pos - p.window_left);
  if (p.chunk_size > 0) kv_start = max(kv_start, pos / p.chunk_size * p.chunk_size);
  int per_split = (kv_len - kv_start + split.num_splits - 1) / split.num_splits;
  per_split = (per_split + kDecodeSplitAlign - 1) / kDecodeSplitAlign * kDecodeSplitAlign;
  b.begin = kv_start + b.split * per_split;
  b.end = min(kv_len, b.begin + per_split);
  return b;
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// With several splits each (token, head block) has one counter: its low 16 bits count tickets,
// its high 16 bits the blocks whose partial rows are visible. A block takes its ticket as its
// warp 0 starts its last tile, so the atomic's latency (about 0.9 us at the end of B=1 L=32768's
// loop on the H200) hides under that tile; the block with the last ticket merges all splits once
// every other block's rows are counted (the ticket's own value shows the count so far). No
// second kernel (and no launch gap) is needed, and the merging block never waits for its own
// rows' write to be acknowledged (the barrier makes them visible to its own threads, the fence
// and count the others'). It resets the counter, which keeps CUDA-graph replays valid. Every
// block that holds a ticket is running, so the wait always ends.
__device__ __forceinline__ uint32_t* split_counter(const DecodeSplit& split, const DecodeBlock& b) {
  return split.counters + b.token * gridDim.x + blockIdx.x;
}

// Thread 0's ticket, with the rows count as it stood (acquire: rows counted are visible after it).
__device__ __forceinline__ uint32_t take_split_ticket(const DecodeSplit& split, const DecodeBlock& b) {
  uint32_t old;
  asm volatile("atom.acquire.gpu.global.add.u32 %0, [%1], 1;"
               : "=r"(old)
               : "l"(split_counter(split, b))
               : "memory");
  return old;
}

// Called by every thread once this block's partial rows are written (ticket: thread 0's).
__device__ __forceinline__ void merge_splits_if_last(const AttentionParams& p, const DecodeSplit& split,
                                                     const DecodeBlock& b, uint32_t ticket) {
  constexpr float kNegInf = -__builtin_huge_valf();
  const uint32_t others = split.num_splits - 1;
  __shared__ bool last;
  uint32_t* counter = split_counter(split, b);
  if (threadIdx.x == 0) last = (ticket & 0xffffu) == others;
  __syncthreads();  // every thread's partial rows are written...
  if (!last) {
    if (threadIdx.x == 0) {
      __threadfence();  // ...and, through the barrier, ordered before the count (as a grid sync does)
      atomicAdd(counter, 1u << 16);
    }
    return;
  }
  if (threadIdx.x == 0) {
    for (uint32_t seen = ticket; (seen >> 16) < others;) seen = load_acquire(counter);
    *counter = 0;  // every other block has made its last access
  }
  __syncthreads();
  auto row_of = [&](int s, int h) {
    return (static_cast<int64_t>(s) * split.num_tokens + b.token) * p.num_q_heads + b.head0 + h;
  };
  // Two output elements per thread, so that a group of 4 heads at head_dim 128 occupies all 256
  // threads of a wide block. Each group of kBatch splits is loaded at once (its LSEs with its
  // rows: one memory latency per group, not one for the weights and one for the rows) and folded
  // into a running maximum, in split order. The LSEs are in log2 units, so each weight is one
  // exp2.
  constexpr int kBatch = 16;
  const int pairs = p.v_head_dim / 2;
  for (int idx = threadIdx.x; idx < b.num_heads * pairs; idx += blockDim.x) {
    const int h = idx / pairs;
    const int d = (idx % pairs) * 2;
    float run_max = kNegInf, denom = 0.0f;
    float2 acc = make_float2(0.0f, 0.0f);
    for (int s0 = 0; s0 < split.num_splits; s0 += kBatch) {
      float lse[kBatch];
      float2 v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int s = s0 + k;
        lse[k] = s < split.num_splits ? __ldcg(split.partial_lse + row_of(s, h)) : kNegInf;
        v[k] = s < split.num_splits
                   ? __ldcg(reinterpret_cast<const float2*>(split.partial_out + row_of(s, h) * p.v_head_dim + d))
                   : make_float2(0.0f, 0.0f);
      }
      float mx = run_max;
#pragma unroll
      for (int k = 0; k < kBatch; ++k) mx = fmaxf(mx, lse[k]);
      const float base = mx == kNegInf ? 0.0f : mx;
      const float rescale = exp2f(run_max - base);  // 0 while run_max is -inf
      denom *= rescale;
      acc.x *= rescale;
      acc.y *= rescale;
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const float e = exp2f(lse[k] - base);  // 0 for an empty split (-inf)
        denom += e;
        acc.x += e * v[k].x;
        acc.y += e * v[k].y;
      }
      run_max = mx;
    }
    float total_lse = run_max == kNegInf ? kNegInf : (run_max + log2f(denom)) * kLn2;
    float out_scale = denom > 0.0f ? 1.0f / denom : 0.0f;
    if (p.sinks != nullptr) {
      float sink_scale = 1.0f;
      total_lse = join_sink(total_lse, p.sinks[b.head0 + h], sink_scale);
      out_scale *= sink_scale;
    }
    const int64_t out = b.token * p.out_stride_token + (b.head0 + h) * p.out_stride_head + d;
    store_io(p.out, p.io_dtype, out, acc.x * out_scale * p.v_descale);
    store_io(p.out, p.io_dtype, out + 1, acc.y * out_scale * p.v_descale);
    if (p.lse != nullptr && d == 0) p.lse[b.token * p.lse_stride_token + b.head0 + h] = total_lse;
  }
}

// Merges kParts partial states per head: m (running max, log2 units), l (sum of exp2) and o
// (unnormalised output) at sm_m[part * heads_stride + h], sm_l[...] and
// sm_o[(part * heads_stride + h) * o_stride + d] (o_stride even). sm_w takes kParts * heads_stride
// + 2 * heads_stride floats. ticket: thread 0's take_split_ticket when there are several splits.
// Must be called by every thread after a barrier.
template <int kParts>
__device__ __forceinline__ void finish_decode(const AttentionParams& p, const DecodeSplit& split,
                                              const DecodeBlock& b, const float* sm_m, const float* sm_l,
                                              const float* sm_o, float* sm_w, int heads_stride, int o_stride,
                                              uint32_t ticket) {
  static_assert(kParts <= 32 && (kParts & (kParts - 1)) == 0, "parts are lanes of one warp");
  constexpr float kNegInf = -__builtin_huge_valf();
  // Each part's weight per head once (kParts neighbouring lanes per head), then two output
  // elements per thread from the weights (recomputing them for every element took four times
  // the shared-memory loads).
  float* sm_lse2 = sm_w + kParts * heads_stride;  // LSE of this key range in log2 units (as m)
  float* sm_inv = sm_lse2 + heads_stride;         // 1 / l, 0 for a head that saw no key
  const int weights = b.num_heads * kParts;  // a multiple of kParts: a group is all in or all out
  if (threadIdx.x < (weights + 31) / 32 * 32) {  // whole warps, for the shuffles
    const bool in = static_cast<int>(threadIdx.x) < weights;
    const int h = threadIdx.x / kParts;
    const int g = threadIdx.x % kParts;
    const float m = in ? sm_m[g * heads_stride + h] : kNegInf;
    float mx = m;
#pragma unroll
    for (int lanes = 1; lanes < kParts; lanes *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, lanes, kParts));
    const float w = mx == kNegInf ? 0.0f : exp2f(m - mx);
    float sum_l = in ? w * sm_l[g * heads_stride + h] : 0.0f;
#pragma unroll
    for (int lanes = 1; lanes < kParts; lanes *= 2) sum_l += __shfl_xor_sync(0xffffffffu, sum_l, lanes, kParts);
    if (in) sm_w[g * heads_stride + h] = w;
    if (in && g == 0) {
      sm_lse2[h] = sum_l > 0.0f ? mx + log2f(sum_l) : kNegInf;
      sm_inv[h] = sum_l > 0.0f ? 1.0f / sum_l : 0.0f;
    }
  }
  __syncthreads();
  const int pairs = p.v_head_dim / 2;
  for (int idx = threadIdx.x; idx < b.num_heads * pairs; idx += blockDim.x) {
    const int h = idx / pairs;
    const int d = (idx % pairs) * 2;
    float2 sum_o = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int g = 0; g < kParts; ++g) {
      const float w = sm_w[g * heads_stride + h];
      const float2 o = *reinterpret_cast<const float2*>(sm_o + (g * heads_stride + h) * o_stride + d);
      sum_o.x += w * o.x;
      sum_o.y += w * o.y;
    }
    const float lse2 = sm_lse2[h];
    const float inv = sm_inv[h];
    const int head = b.head0 + h;
    if (split.num_splits == 1) {
      float sink_scale = 1.0f;
      const float lse = lse2 * kLn2;
      const float total = p.sinks != nullptr ? join_sink(lse, p.sinks[head], sink_scale) : lse;
      const float out_scale = inv * sink_scale * p.v_descale;
      const int64_t out = b.token * p.out_stride_token + head * p.out_stride_head + d;
      store_io(p.out, p.io_dtype, out, sum_o.x * out_scale);
      store_io(p.out, p.io_dtype, out + 1, sum_o.y * out_scale);
      if (p.lse != nullptr && d == 0) p.lse[b.token * p.lse_stride_token + head] = total;
    } else {
      const int64_t row = (static_cast<int64_t>(b.split) * split.num_tokens + b.token) * p.num_q_heads + head;
      *reinterpret_cast<float2*>(split.partial_out + row * p.v_head_dim + d) =
          make_float2(sum_o.x * inv, sum_o.y * inv);
      if (d == 0) split.partial_lse[row] = lse2;
    }
  }
  if (split.num_splits > 1) merge_splits_if_last(p, split, b, ticket);
}

}  // namespace specula::cuda_kernels
