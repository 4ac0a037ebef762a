// Per-step attention metadata shared by backends: cumulative sequence lengths, page tables and
// the local-attention virtual batches (the seed FlashAttention backend's
// make_local_attention_virtual_batches). Host-side planning only; nothing here runs per layer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "specula/batch/forward_batch.h"

namespace specula {

// cu[0] = 0, cu[i + 1] = cu[i] + lens[i].
std::vector<int32_t> cumulative_lens(std::span<const int32_t> lens);

// Page table [batch_size, max_pages]: page p of request i is the page holding its token
// p * page_size, i.e. req_to_token[req][p * page_size] / page_size. Rows are padded with 0 (the
// reserved padding page). max_pages = ceil(max kv_len / page_size), at least 1.
struct PageTable {
  std::vector<int32_t> pages;  // [batch_size, max_pages] row-major
  int max_pages = 0;
  const int32_t* row(int i) const { return pages.data() + static_cast<int64_t>(i) * max_pages; }
};
PageTable build_page_table(const ReqToTokenPool& pool, std::span<const int32_t> req_pool_indices,
                           std::span<const int32_t> kv_lens, int page_size);

// Local chunked attention as independent "virtual" requests, one per (request, chunk) that holds
// queries. Semantics of the seed (worked example: chunk 4, q_seqlens [4, 10, 5], k_seqlens
// [6, 17, 9] -> seqlens_q_local [2, 2, 1, 4, 4, 1, 4, 1], seqlens_k_local [4, 2, 4, 4, 4, 1, 4,
// 1]), with the block-table indices clipped to the table's width as the seed does.
struct LocalAttentionBatches {
  std::vector<int32_t> seqlens_q_local;     // [num_virtual]
  std::vector<int32_t> cu_seqlens_q_local;  // [num_virtual + 1]
  std::vector<int32_t> seqlens_k_local;     // [num_virtual]
  std::vector<int32_t> block_table_local;   // [num_virtual, pages_per_local_batch]
  std::vector<int32_t> batch_index;         // [num_virtual] the real request of each virtual one
  int pages_per_local_batch = 0;
  int attn_chunk_size = 0;  // the effective chunk size used
  int num_virtual() const { return static_cast<int>(seqlens_q_local.size()); }
};

// query_start_loc: [batch_size + 1]; seq_lens: [batch_size] (KV lengths, queries last);
// block_table: [batch_size, block_table_width] pages. attn_chunk_size must be a multiple of
// page_size (a clear error otherwise: the seed silently shrinks the chunk, which changes the
// attention pattern). Where the seed caps the chunk at the longest sequence and rounds it down to
// a page, specula rounds up instead: any chunk >= the longest sequence gives the same attention,
// while rounding down would cut the last page off into a chunk of its own.
LocalAttentionBatches make_local_attention_virtual_batches(int attn_chunk_size,
                                                           std::span<const int32_t> query_start_loc,
                                                           std::span<const int32_t> seq_lens,
                                                           std::span<const int32_t> block_table,
                                                           int block_table_width, int page_size);

}  // namespace specula
