// ReqToTokenPool: slot allocation, exhaustion, double free, writes and bounds.
#include <gtest/gtest.h>

#include "specula/core/error.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {
namespace {

TEST(ReqToTokenPool, AllocWriteFree) {
  ReqToTokenPool pool(4, 32);
  auto slots = pool.alloc(3);
  ASSERT_TRUE(slots.has_value());
  EXPECT_EQ(pool.available_size(), 1);
  EXPECT_FALSE(pool.alloc(2).has_value());
  EXPECT_EQ(pool.available_size(), 1) << "a failed alloc must not take slots";
  const std::vector<int32_t> locs{17, 18, 19, 40, 41};
  pool.write((*slots)[1], 3, locs);
  for (size_t i = 0; i < locs.size(); ++i) EXPECT_EQ(pool.row((*slots)[1])[3 + i], locs[i]);
  EXPECT_THROW(pool.write((*slots)[1], 30, locs), Error);
  pool.free((*slots)[1]);
  EXPECT_THROW(pool.free((*slots)[1]), Error);
  EXPECT_THROW(pool.free(4), Error);
  EXPECT_EQ(pool.available_size(), 2);
}

}  // namespace
}  // namespace specula
