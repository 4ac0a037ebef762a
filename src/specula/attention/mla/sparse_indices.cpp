// Sparse MLA's index conversion on the host: request-relative top-k positions -> global KV slots
// (the rule is in sparse_indices.h; cuda/kernels/sparse_indices.cu is the device twin and must
// give the same integers).
#include "specula/attention/mla/sparse_indices.h"

#include <cstddef>

#include "specula/core/error.h"

namespace specula {

namespace {

bool overlaps(std::span<const int32_t> a, std::span<const int32_t> b) {
  if (a.empty() || b.empty()) return false;
  const int32_t* a_end = a.data() + a.size();
  const int32_t* b_end = b.data() + b.size();
  return a.data() < b_end && b.data() < a_end;
}

}  // namespace

void convert_req_index_to_global_index(const SparseIndexTables& tables, std::span<const int32_t> token_indices,
                                       int topk, std::span<int32_t> out) {
  const size_t num_tokens = tables.req_id_per_token.size();
  const size_t batch_size = tables.kv_lens.size();
  SPECULA_CHECK(topk >= 0, "topk {} is negative", topk);
  SPECULA_CHECK(tables.page_size >= 1, "page_size {} is not valid; it must be >= 1", tables.page_size);
  SPECULA_CHECK(tables.max_pages >= 0, "max_pages {} is negative", tables.max_pages);
  SPECULA_CHECK(tables.page_table.size() == batch_size * static_cast<size_t>(tables.max_pages),
                "page_table has {} entries; {} requests (kv_lens) x max_pages {} need {}", tables.page_table.size(),
                batch_size, tables.max_pages, batch_size * static_cast<size_t>(tables.max_pages));
  const size_t entries = num_tokens * static_cast<size_t>(topk);
  SPECULA_CHECK(token_indices.size() == entries, "token_indices has {} entries; {} tokens x topk {} need {}",
                token_indices.size(), num_tokens, topk, entries);
  SPECULA_CHECK(out.size() == entries, "out has {} entries; {} tokens x topk {} need {}", out.size(), num_tokens,
                topk, entries);
  SPECULA_CHECK(!overlaps(token_indices, std::span<const int32_t>(out.data(), out.size())),
                "out may not alias token_indices");

  const int64_t page_size = tables.page_size;
  for (size_t t = 0; t < num_tokens; ++t) {
    const int32_t req = tables.req_id_per_token[t];
    SPECULA_CHECK(req >= 0 && static_cast<size_t>(req) < batch_size,
                  "req_id_per_token[{}] = {} is out of range [0, {})", t, req, batch_size);
    const int64_t kv_len = tables.kv_lens[static_cast<size_t>(req)];
    const int32_t* pages = tables.page_table.data() + static_cast<size_t>(req) * static_cast<size_t>(tables.max_pages);
    const int32_t* in_row = token_indices.data() + t * static_cast<size_t>(topk);
    int32_t* out_row = out.data() + t * static_cast<size_t>(topk);
    for (int i = 0; i < topk; ++i) {
      const int64_t idx = in_row[i];
      const int64_t page = idx / page_size;  // only used once idx >= 0
      // -1 padding, stale entries (>= kv_len: could name another request's page) and entries
      // past the table's width all map to -1, so the attention kernel skips them.
      if (idx < 0 || idx >= kv_len || page >= tables.max_pages) {
        out_row[i] = -1;
        continue;
      }
      // Slots fit int32 (the pools hold at most INT32_MAX slots); the product is formed in 64 bits.
      out_row[i] = static_cast<int32_t>(static_cast<int64_t>(pages[page]) * page_size + idx % page_size);
    }
  }
}

}  // namespace specula
