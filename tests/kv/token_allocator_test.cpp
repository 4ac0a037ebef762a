// PagedTokenAllocator: page-boundary placement for extend and decode, exhaustion as a returned
// failure with nothing taken, fragmentation and reuse, and rejected frees that change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "specula/core/error.h"
#include "specula/kv/token_allocator.h"

namespace specula {
namespace {

class Allocator : public ::testing::TestWithParam<int> {};

TEST_P(Allocator, ExtendFillsLastPageThenNewPages) {
  const int ps = GetParam();
  PagedTokenAllocator a(64 * ps, ps);
  // Request 0: 0 -> 2.5 pages; request 1: 0 -> 1 token.
  const int32_t len0 = 2 * ps + (ps + 1) / 2, len1 = 1;
  auto first = a.alloc_extend(std::vector<int32_t>{0, 0}, std::vector<int32_t>{len0, len1}, std::vector<int32_t>{-1, -1});
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->size(), static_cast<size_t>(len0 + len1));
  std::vector<int32_t> r0(first->begin(), first->begin() + len0);
  for (int t = 0; t < len0; ++t) {
    EXPECT_EQ(r0[static_cast<size_t>(t)] % ps, t % ps) << "token " << t << " not at its page offset";
    if (t % ps != 0) {
      EXPECT_EQ(r0[static_cast<size_t>(t)], r0[static_cast<size_t>(t - 1)] + 1);
    }
    EXPECT_GE(r0[static_cast<size_t>(t)], ps) << "page 0 is reserved";
  }
  // Extend request 0 by 1.5 pages from its partially filled last page.
  const int32_t add = ps + ps / 2 + 1;
  auto second = a.alloc_extend(std::vector<int32_t>{len0}, std::vector<int32_t>{len0 + add},
                               std::vector<int32_t>{r0.back()});
  ASSERT_TRUE(second.has_value());
  int32_t prev = r0.back();
  for (int i = 0; i < add; ++i) {
    const int t = len0 + i;
    const int32_t slot = (*second)[static_cast<size_t>(i)];
    EXPECT_EQ(slot % ps, t % ps);
    if (t % ps != 0) {
      EXPECT_EQ(slot, prev + 1) << "token " << t << " must continue its page";
    }
    prev = slot;
  }
}

TEST_P(Allocator, DecodeStartsNewPageOnlyAtBoundary) {
  const int ps = GetParam();
  PagedTokenAllocator a(16 * ps, ps);
  auto slots = a.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{1}, std::vector<int32_t>{-1});
  ASSERT_TRUE(slots.has_value());
  int32_t last = (*slots)[0];
  const int64_t free_before = a.num_free_pages();
  for (int32_t seq_len = 2; seq_len <= 3 * ps + 1; ++seq_len) {
    auto d = a.alloc_decode(std::vector<int32_t>{seq_len}, std::vector<int32_t>{last});
    ASSERT_TRUE(d.has_value());
    const int32_t slot = (*d)[0];
    if ((seq_len - 1) % ps == 0) {
      EXPECT_EQ(slot % ps, 0) << "token " << seq_len - 1 << " starts a page";
    } else {
      EXPECT_EQ(slot, last + 1);
    }
    last = slot;
  }
  EXPECT_EQ(free_before - a.num_free_pages(), (3 * ps + 1 + ps - 1) / ps - 1);
}

TEST_P(Allocator, ExhaustionIsAReturnedFailureThatTakesNothing) {
  const int ps = GetParam();
  PagedTokenAllocator a(4 * ps, ps);
  EXPECT_EQ(a.available_size(), 4 * ps);
  auto big = a.alloc_extend(std::vector<int32_t>{0, 0}, std::vector<int32_t>{3 * ps, 2 * ps}, std::vector<int32_t>{0, 0});
  EXPECT_FALSE(big.has_value());
  EXPECT_EQ(a.available_size(), 4 * ps) << "a failed allocation must not take pages";
  auto all = a.alloc(4 * ps);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(a.available_size(), 0);
  EXPECT_FALSE(a.alloc(ps).has_value());
  EXPECT_FALSE(a.alloc_decode(std::vector<int32_t>{ps + 1}, std::vector<int32_t>{(*all)[ps - 1]}).has_value());
  a.free(*all);
  EXPECT_EQ(a.available_size(), 4 * ps);
}

TEST_P(Allocator, FragmentationAndReuse) {
  const int ps = GetParam();
  const int pages = 32;
  PagedTokenAllocator a(static_cast<int64_t>(pages) * ps, ps);
  std::mt19937 rng(std::random_device{}());
  std::vector<std::vector<int32_t>> live;
  std::set<int32_t> owned_pages;
  for (int step = 0; step < 2000; ++step) {
    if (!live.empty() && (rng() % 2 == 0 || a.num_free_pages() == 0)) {
      const size_t i = rng() % live.size();
      a.free(live[i]);
      for (int32_t s : live[i]) owned_pages.erase(s / ps);
      live.erase(live.begin() + static_cast<int64_t>(i));
    } else {
      const int n = 1 + static_cast<int>(rng() % 4);
      auto got = a.alloc(static_cast<int64_t>(n) * ps);
      if (!got) {
        ASSERT_LT(a.num_free_pages(), n);
        continue;
      }
      std::set<int32_t> new_pages;
      for (int32_t s : *got) new_pages.insert(s / ps);
      for (int32_t p : new_pages) {
        ASSERT_TRUE(owned_pages.insert(p).second) << "page " << p << " handed out twice";
        ASSERT_GE(p, 1);
        ASSERT_LE(p, pages);
      }
      live.push_back(*got);
    }
    ASSERT_EQ(a.num_free_pages() + static_cast<int64_t>(owned_pages.size()), pages);
  }
}

TEST_P(Allocator, FreeAfterFreeIsRejectedAndChangesNothing) {
  const int ps = GetParam();
  PagedTokenAllocator a(8 * ps, ps);
  auto x = a.alloc(2 * ps);
  auto y = a.alloc(ps);
  ASSERT_TRUE(x && y);
  a.free(*x);
  const int64_t free_pages = a.num_free_pages();
  std::vector<int32_t> mixed = *y;
  mixed.push_back((*x)[0]);  // y is live, x's page is already free: the whole call is rejected
  try {
    a.free(mixed);
    FAIL() << "double free accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not allocated"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.num_free_pages(), free_pages) << "a rejected free changed state";
  a.free(*y);  // y is still live and frees fine
  EXPECT_EQ(a.num_free_pages(), 8);
  EXPECT_THROW(a.free(std::vector<int32_t>{0}), Error);  // the padding page
  EXPECT_THROW(a.free(std::vector<int32_t>{static_cast<int32_t>(a.total_slots())}), Error);
}

TEST_P(Allocator, BadArgumentsNameTheValue) {
  const int ps = GetParam();
  PagedTokenAllocator a(8 * ps, ps);
  if (ps > 1) {
    try {
      a.alloc(ps + 1);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(ps + 1)), std::string::npos);
    }
  }
  EXPECT_THROW(a.alloc_extend(std::vector<int32_t>{3}, std::vector<int32_t>{2}, std::vector<int32_t>{ps}), Error);
  // last_loc that is not allocated
  EXPECT_THROW(a.alloc_extend(std::vector<int32_t>{1}, std::vector<int32_t>{2}, std::vector<int32_t>{ps}), Error);
}

INSTANTIATE_TEST_SUITE_P(PageSize, Allocator, ::testing::Values(1, 2, 16, 64),
                         [](const auto& info) { return "PageSize" + std::to_string(info.param); });

TEST(AllocatorConstruction, PageSizeMustBePowerOfTwo) {
  for (int ps : {0, 3, 12, -4}) {
    try {
      PagedTokenAllocator a(1024, ps);
      FAIL() << "page_size " << ps << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("page_size " + std::to_string(ps)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace specula
