// ForwardBatch: lengths per mode and validation messages.
#include <gtest/gtest.h>

#include "specula/batch/forward_batch.h"
#include "specula/core/error.h"

namespace specula {
namespace {

ForwardBatch extend_batch() {
  ForwardBatch b;
  b.forward_mode = ForwardMode::EXTEND;
  b.batch_size = 2;
  b.req_pool_indices = {0, 1};
  b.seq_lens = {7, 3};
  b.extend_prefix_lens = {4, 0};
  b.extend_seq_lens = {3, 3};
  b.out_cache_loc = {1, 2, 3, 4, 5, 6};
  return b;
}

TEST(ForwardBatch, LengthsPerMode) {
  ForwardBatch b = extend_batch();
  EXPECT_NO_THROW(b.validate());
  EXPECT_EQ(b.query_len(0), 3);
  EXPECT_EQ(b.kv_len(0), 7);
  b.forward_mode = ForwardMode::TARGET_VERIFY;
  b.spec_info = std::make_shared<SpecInfo>();
  b.spec_info->num_draft_tokens = 3;
  EXPECT_EQ(b.query_len(1), 3);
  EXPECT_EQ(b.kv_len(1), 6) << "verify KV = committed + draft tokens";
  EXPECT_NO_THROW(b.validate());
  b.spec_info->custom_mask.assign(5, 1);
  EXPECT_THROW(b.validate(), Error);
  b.spec_info->custom_mask.assign(3 * 10 + 3 * 6, 1);
  EXPECT_NO_THROW(b.validate());
  b.forward_mode = ForwardMode::DECODE;
  b.out_cache_loc = {1, 2};
  EXPECT_EQ(b.query_len(0), 1);
  EXPECT_NO_THROW(b.validate());
  EXPECT_EQ(forward_mode_name(ForwardMode::DRAFT_EXTEND), "DRAFT_EXTEND");
}

TEST(ForwardBatch, ValidationNamesTheField) {
  ForwardBatch b = extend_batch();
  b.extend_prefix_lens[1] = 1;
  try {
    b.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request 1: extend_prefix_len 1 + extend_seq_len 3 != seq_len 3"), std::string::npos)
        << e.what();
  }
  b = extend_batch();
  b.out_cache_loc.pop_back();
  EXPECT_THROW(b.validate(), Error);
}

}  // namespace
}  // namespace specula
