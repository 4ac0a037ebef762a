// convert_req_index_to_global_index (attention/mla/sparse_indices.h): a hand-worked example, the
// -1 rules one by one (padding, other negatives, positions at or past kv_len, pages past the
// table's width), random cases against a naive loop at page sizes 1, 16 and 64, and the size
// checks. Fresh random inputs every run; the seed is printed on failure.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "specula/attention/mla/sparse_indices.h"
#include "specula/core/error.h"

namespace specula {
namespace {

std::vector<int32_t> convert(const std::vector<int32_t>& req_id, const std::vector<int32_t>& page_table,
                             const std::vector<int32_t>& kv_lens, int max_pages, int page_size,
                             const std::vector<int32_t>& indices, int topk) {
  std::vector<int32_t> out(indices.size(), 12345);
  convert_req_index_to_global_index({req_id, page_table, kv_lens, max_pages, page_size}, indices, topk, out);
  return out;
}

TEST(SparseIndices, HandWorkedExample) {
  // page_size 4; request 0 owns pages 5, 2, 9 and 10 tokens; request 1 owns pages 7, 1 and 6 tokens
  // (its third table entry is unused).
  const std::vector<int32_t> page_table = {5, 2, 9, /**/ 7, 1, 0};
  const std::vector<int32_t> kv_lens = {10, 6};
  const std::vector<int32_t> req_id = {0, 1, 0};
  const std::vector<int32_t> indices = {
      0,  5, 9,  10, -1,  // request 0: 5 -> page 2 slot 9; 9 -> page 9 slot 37; 10 is past kv_len
      3,  4, 5,  6,  -7,  // request 1: 3 -> 31; 4 -> page 1 slot 4; 6 is past kv_len; -7 is negative
      11, 8, 12, 2,  1,   // request 0 again
  };
  const std::vector<int32_t> expected = {
      20, 9, 37, -1, -1,  //
      31, 4, 5,  -1, -1,  //
      -1, 36, -1, 22, 21,
  };
  EXPECT_EQ(convert(req_id, page_table, kv_lens, 3, 4, indices, 5), expected);
}

TEST(SparseIndices, PositionsPastTheTableWidthAreMinusOne) {
  // kv_len 20 claims more positions than 2 pages of 4 hold: positions >= 8 have no page entry
  // (the seed's out-of-bounds rule) and become -1, not a read past the row.
  const std::vector<int32_t> page_table = {3, 6};
  const std::vector<int32_t> out = convert({0}, page_table, {20}, 2, 4, {7, 8, 19, 0}, 4);
  EXPECT_EQ(out, (std::vector<int32_t>{27, -1, -1, 12}));
}

TEST(SparseIndices, PageSizeOneIsThePageTableItself) {
  const std::vector<int32_t> page_table = {40, 41, 7, 3};
  EXPECT_EQ(convert({0, 0}, page_table, {4}, 4, 1, {3, 2, 1, 0, -1, 4}, 3),
            (std::vector<int32_t>{3, 7, 41, 40, -1, -1}));
}

TEST(SparseIndices, EmptyShapes) {
  EXPECT_TRUE(convert({}, {1}, {1}, 1, 1, {}, 8).empty());
  EXPECT_TRUE(convert({0, 0}, {1}, {1}, 1, 1, {}, 0).empty());
}

int32_t naive_slot(const std::vector<int32_t>& page_table, const std::vector<int32_t>& kv_lens, int max_pages,
                   int page_size, int32_t req, int32_t idx) {
  if (idx == -1) return -1;
  if (idx < 0) return -1;
  if (idx >= kv_lens[static_cast<size_t>(req)]) return -1;
  const int page = idx / page_size;
  if (page >= max_pages) return -1;
  return page_table[static_cast<size_t>(req) * static_cast<size_t>(max_pages) + static_cast<size_t>(page)] *
             page_size +
         idx % page_size;
}

TEST(SparseIndices, RandomCasesMatchANaiveLoop) {
  const uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int page_size : {1, 16, 64}) {
    for (int trial = 0; trial < 20; ++trial) {
      SCOPED_TRACE("page_size " + std::to_string(page_size) + " trial " + std::to_string(trial));
      const int batch = uniform(1, 6);
      const int topk = uniform(1, 300);
      std::vector<int32_t> kv_lens(static_cast<size_t>(batch));
      int longest = 1;
      for (auto& l : kv_lens) {
        l = uniform(0, 700);
        longest = std::max(longest, l);
      }
      // Usually wide enough for every request; every third trial one page short of the longest,
      // so its tail positions fall past the width.
      int max_pages = (longest + page_size - 1) / page_size;
      if (trial % 3 == 2) max_pages = std::max(0, max_pages - 1);
      std::vector<int32_t> page_table(static_cast<size_t>(batch) * static_cast<size_t>(max_pages));
      for (auto& pg : page_table) pg = uniform(0, 5000);
      const int num_tokens = uniform(0, 12);
      std::vector<int32_t> req_id(static_cast<size_t>(num_tokens));
      for (auto& r : req_id) r = uniform(0, batch - 1);
      std::vector<int32_t> indices(static_cast<size_t>(num_tokens) * static_cast<size_t>(topk));
      for (auto& idx : indices) {
        const int kind = uniform(0, 9);
        idx = kind == 0 ? -1 : kind == 1 ? uniform(-100000, -2) : kind == 2 ? uniform(700, 100000) : uniform(0, 720);
      }
      const std::vector<int32_t> out = convert(req_id, page_table, kv_lens, max_pages, page_size, indices, topk);
      for (int t = 0; t < num_tokens; ++t) {
        for (int i = 0; i < topk; ++i) {
          const size_t e = static_cast<size_t>(t) * static_cast<size_t>(topk) + static_cast<size_t>(i);
          ASSERT_EQ(out[e], naive_slot(page_table, kv_lens, max_pages, page_size, req_id[static_cast<size_t>(t)],
                                       indices[e]))
              << "token " << t << " entry " << i << " index " << indices[e];
        }
      }
    }
  }
}

TEST(SparseIndices, BadSizesThrow) {
  const std::vector<int32_t> pt = {1, 2, 3, 4};
  const std::vector<int32_t> lens = {8, 8};
  const std::vector<int32_t> req = {0, 1};
  const std::vector<int32_t> idx(6, 0);
  std::vector<int32_t> out(6);
  // page_table of 4 entries for 2 requests x 3 pages.
  EXPECT_THROW(convert_req_index_to_global_index({req, pt, lens, 3, 2}, idx, 3, out), Error);
  // token_indices / out not num_tokens x topk.
  EXPECT_THROW(convert_req_index_to_global_index({req, pt, lens, 2, 2}, idx, 2, out), Error);
  std::vector<int32_t> short_out(5);
  EXPECT_THROW(convert_req_index_to_global_index({req, pt, lens, 2, 2}, idx, 3, short_out), Error);
  // A request id outside the batch, a bad page size, a negative topk.
  const std::vector<int32_t> bad_req = {0, 2};
  EXPECT_THROW(convert_req_index_to_global_index({bad_req, pt, lens, 2, 2}, idx, 3, out), Error);
  EXPECT_THROW(convert_req_index_to_global_index({req, pt, lens, 2, 0}, idx, 3, out), Error);
  EXPECT_THROW(convert_req_index_to_global_index({req, pt, lens, 2, 2}, {}, -1, {}), Error);
  // out aliasing token_indices.
  std::vector<int32_t> same(6, 0);
  EXPECT_THROW(convert_req_index_to_global_index({req, pt, lens, 2, 2}, same, 3, same), Error);
  EXPECT_NO_THROW(convert_req_index_to_global_index({req, pt, lens, 2, 2}, idx, 3, out));
}

}  // namespace
}  // namespace specula
