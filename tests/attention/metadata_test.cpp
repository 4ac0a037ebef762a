// Metadata builders: the seed's worked example for local-attention virtual batches, the page
// table, cumulative lengths.
#include <gtest/gtest.h>

#include "specula/attention/metadata.h"
#include "specula/core/error.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {
namespace {

TEST(LocalAttentionMetadata, SeedWorkedExample) {
  // attn_chunk_size = 4, q_seqlens = [4, 10, 5], k_seqlens = [6, 17, 9], page_size 2 and the
  // seed's block table [[0..9], [10..19], [20..29]].
  const std::vector<int32_t> cu_q{0, 4, 14, 19};
  const std::vector<int32_t> seq_lens{6, 17, 9};
  std::vector<int32_t> block_table(30);
  for (int i = 0; i < 30; ++i) block_table[static_cast<size_t>(i)] = i;
  const auto local = make_local_attention_virtual_batches(4, cu_q, seq_lens, block_table, 10, 2);
  EXPECT_EQ(local.seqlens_q_local, (std::vector<int32_t>{2, 2, 1, 4, 4, 1, 4, 1}));
  EXPECT_EQ(local.cu_seqlens_q_local, (std::vector<int32_t>{0, 2, 4, 5, 9, 13, 14, 18, 19}));
  EXPECT_EQ(local.seqlens_k_local, (std::vector<int32_t>{4, 2, 4, 4, 4, 1, 4, 1}));
  EXPECT_EQ(local.block_table_local,
            (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19, 22, 23, 24, 25}));
  EXPECT_EQ(local.batch_index, (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 2, 2}));
  EXPECT_EQ(local.pages_per_local_batch, 2);
}

TEST(LocalAttentionMetadata, ChunkMustBeAPageMultiple) {
  const std::vector<int32_t> cu_q{0, 1};
  const std::vector<int32_t> seq_lens{40};
  const std::vector<int32_t> table(3, 1);
  try {
    make_local_attention_virtual_batches(24, cu_q, seq_lens, table, 3, 16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_chunk_size 24"), std::string::npos) << e.what();
  }
}

TEST(LocalAttentionMetadata, ChunkLongerThanEverySequenceKeepsOneChunk) {
  // chunk 8192, page 16, one 100-token sequence: a single virtual request over all 100 keys (the
  // seed would round the chunk down to 96 and split off the last 4 keys).
  const std::vector<int32_t> cu_q{0, 100};
  const std::vector<int32_t> seq_lens{100};
  std::vector<int32_t> table(7);
  for (int i = 0; i < 7; ++i) table[static_cast<size_t>(i)] = 10 + i;
  const auto local = make_local_attention_virtual_batches(8192, cu_q, seq_lens, table, 7, 16);
  EXPECT_EQ(local.seqlens_q_local, (std::vector<int32_t>{100}));
  EXPECT_EQ(local.seqlens_k_local, (std::vector<int32_t>{100}));
  EXPECT_EQ(local.block_table_local, (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16}));
}

TEST(PageTableMetadata, PagesFromRequestTokens) {
  ReqToTokenPool pool(3, 64);
  std::vector<int32_t> tokens;
  for (int page : {7, 3, 9}) {
    for (int i = 0; i < 16; ++i) tokens.push_back(page * 16 + i);
  }
  pool.write(2, 0, tokens);
  const PageTable t = build_page_table(pool, std::vector<int32_t>{2}, std::vector<int32_t>{40}, 16);
  EXPECT_EQ(t.max_pages, 3);
  EXPECT_EQ(t.pages, (std::vector<int32_t>{7, 3, 9}));
  EXPECT_EQ(cumulative_lens(std::vector<int32_t>{3, 0, 5}), (std::vector<int32_t>{0, 3, 3, 8}));
}

}  // namespace
}  // namespace specula
