// Sparse MLA's index conversion (vLLM's triton_convert_req_index_to_global_index): each query
// token's request-relative key positions become global KV slots through the page table,
//   out[t][i] = page_table[req][idx / page_size] * page_size + idx % page_size,
// with req = req_id_per_token[t]. An entry is -1 when idx is -1, negative, at or past the
// request's kv_len, or past the page table's width (the seed's out-of-bounds rule; kv_len is
// specula's addition so a stale index can never read another request's page).
#pragma once

#include <cstdint>
#include <span>

namespace specula {

struct SparseIndexTables {
  std::span<const int32_t> req_id_per_token;  // [num_tokens] row of page_table / kv_lens
  std::span<const int32_t> page_table;        // [batch_size, max_pages]
  std::span<const int32_t> kv_lens;           // [batch_size]
  int max_pages = 0;
  int page_size = 1;
};

// token_indices and out: [num_tokens, topk] row-major (out may not alias token_indices).
void convert_req_index_to_global_index(const SparseIndexTables& tables, std::span<const int32_t> token_indices,
                                       int topk, std::span<int32_t> out);

}  // namespace specula
