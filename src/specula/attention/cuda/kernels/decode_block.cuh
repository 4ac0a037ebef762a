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

__device__ __forceinline__ int32_t load_acquire(const int32_t* address) {
  int32_t value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// With several splits each (token, head block) has two counters: tickets, taken by each block
// as its key loop ends (before it merges its warps, so the atomic's latency overlaps that work),
// and rows written, counted once a block's partial rows are visible. The block with the last
// ticket waits for the others' rows and merges all splits, so no second kernel (and no launch
// gap) is needed, and it never waits for its own rows' write to be acknowledged (the barrier
// makes them visible to its own threads, the fence and count the others'). It resets both
// counters, which keeps CUDA-graph replays valid. Every block that holds a ticket is running,
// so the wait always ends.
__device__ __forceinline__ int32_t* split_counters(const DecodeSplit& split, const DecodeBlock& b) {
  return split.counters + 2 * (b.token * gridDim.x + blockIdx.x);
}

// Called by every thread once this block's partial rows are written (ticket: thread 0's).
__device__ __forceinline__ void merge_splits_if_last(const AttentionParams& p, const DecodeSplit& split,
                                                     const DecodeBlock& b, int32_t ticket) {
  constexpr float kNegInf = -__builtin_huge_valf();
  __shared__ bool last;
  int32_t* counters = split_counters(split, b);
  if (threadIdx.x == 0) last = ticket == split.num_splits - 1;
  __syncthreads();  // every thread's partial rows are written...
  if (!last) {
    if (threadIdx.x == 0) {
      __threadfence();  // ...and, through the barrier, ordered before the count (as a grid sync does)
      atomicAdd(counters + 1, 1);
    }
    return;
  }
  if (threadIdx.x == 0) {
    counters[0] = 0;
    while (load_acquire(counters + 1) < split.num_splits - 1) {
    }
    counters[1] = 0;
  }
  __syncthreads();
  auto row_of = [&](int s, int h) {
    return (static_cast<int64_t>(s) * split.num_tokens + b.token) * p.num_q_heads + b.head0 + h;
  };
  // Four output elements per thread. Each group of kBatch splits is loaded at once (its LSEs with
  // its rows: one memory latency per group, not one for the weights and one for the rows) and
  // folded into a running maximum, in split order.
  constexpr int kBatch = 16;
  const int quads = p.v_head_dim / 4;
  for (int idx = threadIdx.x; idx < b.num_heads * quads; idx += blockDim.x) {
    const int h = idx / quads;
    const int d = (idx % quads) * 4;
    float run_max = kNegInf, denom = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < split.num_splits; s0 += kBatch) {
      float lse[kBatch];
      float4 v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int s = s0 + k;
        lse[k] = s < split.num_splits ? __ldcg(split.partial_lse + row_of(s, h)) : kNegInf;
        v[k] = s < split.num_splits
                   ? __ldcg(reinterpret_cast<const float4*>(split.partial_out + row_of(s, h) * p.v_head_dim + d))
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float mx = run_max;
#pragma unroll
      for (int k = 0; k < kBatch; ++k) mx = fmaxf(mx, lse[k]);
      if (mx == kNegInf) continue;
      const float rescale = run_max == kNegInf ? 0.0f : expf(run_max - mx);
      denom *= rescale;
      acc.x *= rescale;
      acc.y *= rescale;
      acc.z *= rescale;
      acc.w *= rescale;
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const float e = lse[k] == kNegInf ? 0.0f : expf(lse[k] - mx);
        denom += e;
        acc.x += e * v[k].x;
        acc.y += e * v[k].y;
        acc.z += e * v[k].z;
        acc.w += e * v[k].w;
      }
      run_max = mx;
    }
    float total_lse = run_max == kNegInf ? kNegInf : run_max + logf(denom);
    float out_scale = denom > 0.0f ? 1.0f / denom : 0.0f;
    if (p.sinks != nullptr) {
      float sink_scale = 1.0f;
      total_lse = join_sink(total_lse, p.sinks[b.head0 + h], sink_scale);
      out_scale *= sink_scale;
    }
    const int64_t out = b.token * p.out_stride_token + (b.head0 + h) * p.out_stride_head + d;
    store_io(p.out, p.io_dtype, out, acc.x * out_scale * p.v_descale);
    store_io(p.out, p.io_dtype, out + 1, acc.y * out_scale * p.v_descale);
    store_io(p.out, p.io_dtype, out + 2, acc.z * out_scale * p.v_descale);
    store_io(p.out, p.io_dtype, out + 3, acc.w * out_scale * p.v_descale);
    if (p.lse != nullptr && d == 0) p.lse[b.token * p.lse_stride_token + b.head0 + h] = total_lse;
  }
}

// Merges kParts partial states per head: m (running max, log2 units), l (sum of exp2) and o
// (unnormalised output) at sm_m[part * heads_stride + h], sm_l[...] and
// sm_o[(part * heads_stride + h) * o_stride + d]. Must be called by every thread after a barrier.
template <int kParts>
__device__ __forceinline__ void finish_decode(const AttentionParams& p, const DecodeSplit& split,
                                              const DecodeBlock& b, const float* sm_m, const float* sm_l,
                                              const float* sm_o, int heads_stride, int o_stride) {
  constexpr float kNegInf = -__builtin_huge_valf();
  int32_t ticket = 0;
  if (split.num_splits > 1 && threadIdx.x == 0) ticket = atomicAdd(split_counters(split, b), 1);
  for (int idx = threadIdx.x; idx < b.num_heads * p.v_head_dim; idx += blockDim.x) {
    const int h = idx / p.v_head_dim;
    const int d = idx % p.v_head_dim;
    float mx = kNegInf;
    for (int g = 0; g < kParts; ++g) mx = fmaxf(mx, sm_m[g * heads_stride + h]);
    float sum_l = 0.0f, sum_o = 0.0f;
    if (mx != kNegInf) {
      for (int g = 0; g < kParts; ++g) {
        const float w = exp2f(sm_m[g * heads_stride + h] - mx);
        sum_l += w * sm_l[g * heads_stride + h];
        sum_o += w * sm_o[(g * heads_stride + h) * o_stride + d];
      }
    }
    // Natural-log LSE of this key range (m is in log2 units).
    const float lse = sum_l > 0.0f ? (mx + log2f(sum_l)) * kLn2 : kNegInf;
    const float o_norm = sum_l > 0.0f ? sum_o / sum_l : 0.0f;
    const int head = b.head0 + h;
    if (split.num_splits == 1) {
      float out_scale = 1.0f;
      const float total = p.sinks != nullptr ? join_sink(lse, p.sinks[head], out_scale) : lse;
      store_io(p.out, p.io_dtype, b.token * p.out_stride_token + head * p.out_stride_head + d,
               o_norm * out_scale * p.v_descale);
      if (p.lse != nullptr && d == 0) p.lse[b.token * p.lse_stride_token + head] = total;
    } else {
      const int64_t row = (static_cast<int64_t>(b.split) * split.num_tokens + b.token) * p.num_q_heads + head;
      split.partial_out[row * p.v_head_dim + d] = o_norm;
      if (d == 0) split.partial_lse[row] = lse;
    }
  }
  if (split.num_splits > 1) merge_splits_if_last(p, split, b, ticket);
}

}  // namespace specula::cuda_kernels
