// The wgmma prefill kernel (prefill_wgmma.cu): the attention backend's selection function and the
// expanded MLA prefill send it the cases it is built for (prefill_wgmma_supports, which it asserts).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specula/attention/cuda/kernels/attention_params.h"

namespace specula::cuda_kernels {

// A cache of the query's 16-bit type at head_dim 64 or 128, or bf16 at head_dim 192 with v_head_dim
// 128; the only kernel that serves kv_row_start and q_kv_offset.
bool prefill_wgmma_supports(const AttentionParams& params);

void launch_prefill_wgmma(const AttentionParams& params, const PrefillWork& work, cudaStream_t stream);

// PrefillWork::heads_per_group for a step whose K and V take kv_bytes_per_kv_head per KV head. All
// heads when every head's K/V fits the L2 (the whole grid then runs heaviest first); otherwise as
// many whole GQA groups as keep the K/V that a group's blocks read within half of the L2, so the
// blocks running together share their tiles there instead of each streaming its own head's from
// memory (at least one GQA group).
int prefill_head_group(int64_t kv_bytes_per_kv_head, int num_q_heads, int num_kv_heads, int64_t l2_bytes);

// The (work item, query head) of block `block` of num_items x num_heads: blocks run heads_per_group
// heads at a time (0: all), heads fastest and items last to first within a group, since the last
// tiles of a causal sequence see the most keys and starting with them leaves the short ones to fill
// the tail.
__host__ __device__ inline void prefill_block_work(int block, int num_items, int num_heads, int heads_per_group,
                                                   int& item, int& head) {
  const int group = heads_per_group > 0 && heads_per_group < num_heads ? heads_per_group : num_heads;
  const int group_blocks = group * num_items;
  const int first = block / group_blocks * group;
  const int heads = num_heads - first < group ? num_heads - first : group;
  const int in_group = block % group_blocks;
  item = num_items - 1 - in_group / heads;
  head = first + in_group % heads;
}

}  // namespace specula::cuda_kernels
