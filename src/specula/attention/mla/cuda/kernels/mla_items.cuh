// What one MLA work item covers (shared by the MLA attention kernels): its query rows, its key
// range after causal tile skipping and the split, and the cache slot of each key.
#pragma once

#include <cstdint>

#include "specula/attention/mla/cuda/kernels/mla_attention.h"

namespace specula::cuda_kernels::mla {

struct Item {
  int64_t row0;       // global query row of the block's row 0 (token * num_q_heads + head)
  int rows;           // valid rows in the block
  int key_begin;      // [key_begin, key_end): dense key positions or sparse list entries
  int key_end;
  int unit;
  int split;
  int q_len, kv_len;  // dense
};

// Dense items come from the planned list (requests differ in rows); sparse ones are implied by
// the block index (every token has the same head blocks and splits), so sparse steps need no
// per-step upload and replay inside CUDA graphs as they are. Paired blocks (clusters of two, see
// mla_attention.cu) take head blocks 2j and 2j + 1 of the same token and split: the pair's rank
// is the fastest-moving part of the index (dense items are planned in that order, MlaWorkItem).
__device__ __forceinline__ MlaWorkItem item_of(const MlaAttentionParams& p, bool paired) {
  if (p.slots == nullptr) return p.items[blockIdx.x];
  const int head_blocks = (p.num_q_heads + kMlaBlockRows - 1) / kMlaBlockRows;
  const int per_unit = head_blocks * p.num_splits;
  const int bid = static_cast<int>(blockIdx.x);
  if (paired) {
    const int pairs_per_unit = per_unit / 2;
    const int pair = bid >> 1;
    const int within = pair % pairs_per_unit;
    return {pair / pairs_per_unit, 2 * (within / p.num_splits) + (bid & 1), within % p.num_splits, 0};
  }
  return {bid / per_unit, (bid % per_unit) / p.num_splits, bid % p.num_splits, 0};
}

__device__ __forceinline__ Item decode_item(const MlaAttentionParams& p, const MlaWorkItem& w) {
  Item it{};
  it.unit = w.unit;
  it.split = w.split;
  const int H = p.num_q_heads;
  int total_keys;
  if (p.slots != nullptr) {
    it.row0 = static_cast<int64_t>(w.unit) * H + w.row_block * kMlaBlockRows;
    it.rows = min(kMlaBlockRows, H - w.row_block * kMlaBlockRows);
    total_keys = p.topk;
    it.key_end = p.topk;
  } else {
    it.q_len = p.q_lens[w.unit];
    it.kv_len = p.kv_lens[w.unit];
    const int first_row = w.row_block * kMlaBlockRows;
    it.row0 = static_cast<int64_t>(p.first_token[w.unit]) * H + first_row;
    it.rows = min(kMlaBlockRows, it.q_len * H - first_row);
    total_keys = it.kv_len;
    // Causal tile skipping: no row of this block sees past its last token's position.
    const int last_token = min(it.q_len - 1, (first_row + kMlaBlockRows - 1) / H);
    it.key_end = min(it.kv_len, it.kv_len - it.q_len + last_token + 1);
  }
  const int per_split = (total_keys + p.num_splits - 1) / p.num_splits;
  const int chunk = (per_split + p.split_align - 1) / p.split_align * p.split_align;
  it.key_begin = min(w.split * chunk, it.key_end);
  it.key_end = min((w.split + 1) * chunk, it.key_end);
  if (it.rows < 0) it.rows = 0;
  return it;
}

// The cache slot of key position j of the item as fetched: the loaded list entry (sparse) or page
// (dense, with the key's offset in it), resolved by resolve_slot only where it is used. The paired
// fp8 converters fetch their shares' slots a tile ahead; resolved at once, ptxas widens the loaded
// index immediately and the thread waits for the load right there (ncu, paired sparse fp8: over a
// third of the converters' stall samples on that one instruction). Resolving at use measured +2-3%
// on sparse fp8 (H200); the bf16 and unpaired fp8 producers still resolve at once, since deferring
// there measured 1.3% slower on dense bf16.
struct SlotRef {
  int32_t raw;  // < 0: no key
  int32_t offset;
};

__device__ __forceinline__ SlotRef fetch_slot(const MlaAttentionParams& p, const Item& it, int j) {
  if (j >= it.key_end) return {-1, 0};
  if (p.slots != nullptr) return {p.slots[static_cast<int64_t>(it.unit) * p.topk + j], 0};
  return {p.page_table[static_cast<int64_t>(it.unit) * p.max_pages + j / p.page_size], j % p.page_size};
}

// The global slot, or -1 when there is none.
__device__ __forceinline__ int64_t resolve_slot(const MlaAttentionParams& p, SlotRef r) {
  if (r.raw < 0) return -1;
  return p.slots != nullptr ? r.raw : static_cast<int64_t>(r.raw) * p.page_size + r.offset;
}

}  // namespace specula::cuda_kernels::mla
