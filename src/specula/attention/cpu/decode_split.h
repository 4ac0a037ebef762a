// Long decode rows split over their keys. A decode item whose query token sees more than
// kDecodeSplitMinKeys keys is cut into chunks of kDecodeSplitKeys keys, at multiples of
// kDecodeSplitKeys from key 0, and the chunks of every KV head of that token are scheduled
// chunk by chunk: the threads then read one region of the sequence's KV pages at a time instead of
// each streaming the whole sequence for one head. With a pool far larger than the L3 that pays:
// the lines the prefetchers fetch past one head's 256-byte rows (the next head's) are still cached
// when that head's item reads them (one sequence of 32,768 keys: 27% of the copy rate unsplit,
// against 42% for 16 sequences of 2,048 keys). Each chunk's result is normalised by its own sum
// and carries its log-sum-exp; merge_decode_chunks combines them in chunk order. Where a row is
// split depends only on its own key count, so results do not depend on the batch or the threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "specula/attention/cpu/tile_kernel.h"

namespace specula {

class ThreadPool;

inline constexpr int kDecodeSplitKeys = 2048;
inline constexpr int kDecodeSplitMinKeys = 4096;

struct DecodeSplit {
  // The call's items: unsplit items longer than a chunk, then the chunks (token by token, chunk by
  // chunk, KV head by KV head), then the other unsplit items.
  std::vector<CpuWorkItem> items;
  struct Merge {
    CpuWorkItem item;  // the item as planned (its heads and token)
    int64_t first;     // its first chunk's slot in the partial buffer
    int chunks;        // slots of num_heads x (v_head_dim + 1) floats, chunk after chunk
  };
  std::vector<Merge> merges;
  int64_t partial_floats = 0;
};

// items: the plan's items, in its order; only one-token items are split (the decode kernel's).
DecodeSplit split_decode_items(const CpuAttentionParams& p, std::span<const CpuAttentionSeq> seqs,
                               std::span<const CpuWorkItem> items);

// Writes out (and lse) of every split row from its chunks' partial results; a sink joins the
// denominator here.
void merge_decode_chunks(const CpuAttentionParams& p, std::span<const CpuAttentionSeq> seqs, const DecodeSplit& split,
                         const float* partials, ThreadPool& pool);

}  // namespace specula
