// Metadata builders. make_local_attention_virtual_batches follows the seed's array program step
// by step (first partial block, full middle blocks, last partial block) with plain loops.
#include "specula/attention/metadata.h"

#include <algorithm>

#include "specula/core/error.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

std::vector<int32_t> cumulative_lens(std::span<const int32_t> lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

PageTable build_page_table(const ReqToTokenPool& pool, std::span<const int32_t> req_pool_indices,
                           std::span<const int32_t> kv_lens, int page_size) {
  SPECULA_ASSERT(req_pool_indices.size() == kv_lens.size());
  int32_t max_len = 1;
  for (int32_t len : kv_lens) max_len = std::max(max_len, len);
  PageTable table;
  table.max_pages = (max_len + page_size - 1) / page_size;
  table.pages.assign(kv_lens.size() * static_cast<size_t>(table.max_pages), 0);
  for (size_t i = 0; i < kv_lens.size(); ++i) {
    const int32_t* tokens = pool.row(req_pool_indices[i]);
    const int32_t num_pages = (kv_lens[i] + page_size - 1) / page_size;
    for (int32_t p = 0; p < num_pages; ++p) {
      const int32_t slot = tokens[p * page_size];
      // The first token of every page sits at the start of a real page (page 0 is padding).
      SPECULA_CHECK(slot >= page_size && slot % page_size == 0,
                    "request {}: token {} is at KV slot {}, which does not start a page of {} slots "
                    "(or lies in the reserved page 0)", i, p * page_size, slot, page_size);
      table.pages[i * static_cast<size_t>(table.max_pages) + static_cast<size_t>(p)] = slot / page_size;
    }
  }
  return table;
}

LocalAttentionBatches make_local_attention_virtual_batches(int attn_chunk_size,
                                                           std::span<const int32_t> query_start_loc,
                                                           std::span<const int32_t> seq_lens,
                                                           std::span<const int32_t> block_table,
                                                           int block_table_width, int page_size) {
  const size_t batch_size = seq_lens.size();
  SPECULA_CHECK(page_size >= 1, "page_size {} is not valid", page_size);
  SPECULA_CHECK(attn_chunk_size >= 1 && attn_chunk_size % page_size == 0,
                "attention_chunk_size {} is not valid; it must be a positive multiple of page_size {}",
                attn_chunk_size, page_size);
  SPECULA_CHECK(query_start_loc.size() == batch_size + 1, "query_start_loc has {} entries; expected {}",
                query_start_loc.size(), batch_size + 1);
  SPECULA_CHECK(block_table.size() == batch_size * static_cast<size_t>(block_table_width),
                "block_table has {} entries; expected {} x {}", block_table.size(), batch_size,
                block_table_width);
  LocalAttentionBatches out;
  if (batch_size == 0) return out;

  const int32_t max_seq_len = std::max(1, *std::max_element(seq_lens.begin(), seq_lens.end()));
  const int32_t max_seq_len_paged = (max_seq_len + page_size - 1) / page_size * page_size;
  const int32_t chunk = std::max(page_size, std::min(attn_chunk_size, max_seq_len_paged));
  out.attn_chunk_size = chunk;
  out.pages_per_local_batch = chunk / page_size;

  for (size_t b = 0; b < batch_size; ++b) {
    const int32_t q_len = query_start_loc[b + 1] - query_start_loc[b];
    const int32_t k_len = seq_lens[b];
    SPECULA_CHECK(q_len >= 0 && q_len <= k_len,
                  "request {}: local attention needs 0 <= q_len ({}) <= seq_len ({})", b, q_len, k_len);
    if (q_len == 0) continue;  // nothing to attend for this request in this step
    // Queries that fall in the chunk holding the first query, then whole chunks; the key range
    // of a virtual request is its chunk up to its last query.
    const int32_t first_q_pos = k_len - q_len;
    const int32_t q_in_first = std::min(chunk - first_q_pos % chunk, q_len);
    const int32_t num_blocks = 1 + (q_len - q_in_first + chunk - 1) / chunk;
    const int32_t tokens_in_last = k_len % chunk == 0 ? chunk : k_len % chunk;
    for (int32_t blk = 0; blk < num_blocks; ++blk) {
      const int32_t q_local = blk == 0 ? q_in_first : std::min(q_len - q_in_first - chunk * (blk - 1), chunk);
      const int32_t k_local = blk == num_blocks - 1 ? tokens_in_last : chunk;
      const int32_t blocks_after = num_blocks - 1 - blk;
      const int32_t k_start = k_len - (blocks_after * chunk + tokens_in_last);
      out.seqlens_q_local.push_back(q_local);
      out.seqlens_k_local.push_back(k_local);
      out.batch_index.push_back(static_cast<int32_t>(b));
      const int32_t first_page = k_start / page_size;
      for (int32_t p = 0; p < out.pages_per_local_batch; ++p) {
        const int32_t index = std::min(first_page + p, block_table_width - 1);
        out.block_table_local.push_back(block_table[b * static_cast<size_t>(block_table_width) +
                                                    static_cast<size_t>(index)]);
      }
    }
  }
  out.cu_seqlens_q_local = cumulative_lens(out.seqlens_q_local);
  return out;
}

}  // namespace specula
