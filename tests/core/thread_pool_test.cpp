// ThreadPool: every item runs exactly once, thread indices are in range, exceptions propagate,
// nested loops run inline.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "specula/core/error.h"
#include "specula/core/thread_pool.h"

namespace specula {
namespace {

TEST(ThreadPool, EveryItemOnceAcrossManyJobs) {
  ThreadPool pool(4);
  for (int job = 0; job < 200; ++job) {
    const int n = 1 + job * 7 % 301;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> bad_thread{0};
    pool.parallel_for(n, [&](int64_t i, int t) {
      hits[static_cast<size_t>(i)].fetch_add(1);
      if (t < 0 || t >= pool.num_threads()) bad_thread.fetch_add(1);
    });
    for (int i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "job " << job << " item " << i;
    ASSERT_EQ(bad_thread.load(), 0);
  }
}

TEST(ThreadPool, ExceptionReachesCaller) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, [](int64_t i, int) {
    if (i == 37) throw std::runtime_error("item 37");
  }), std::runtime_error);
  std::atomic<int> count{0};
  pool.parallel_for(50, [&](int64_t, int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 50);  // the pool still works after an exception
}

TEST(ThreadPool, NestedParallelForRunsInlineUnderTheSameIndex) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  std::atomic<int> index_mismatch{0};
  pool.parallel_for(8, [&](int64_t, int outer) {
    pool.parallel_for(5, [&](int64_t, int inner) {
      total.fetch_add(1);
      if (inner != outer) index_mismatch.fetch_add(1);
    });
  });
  EXPECT_EQ(total.load(), 40);
  EXPECT_EQ(index_mismatch.load(), 0);
}

TEST(ThreadPool, NoTwoRunningItemsShareAThreadIndex) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> in_use(4);
  std::atomic<int> clashes{0};
  pool.parallel_for(400, [&](int64_t, int t) {
    if (in_use[static_cast<size_t>(t)].fetch_add(1) != 0) clashes.fetch_add(1);
    volatile double x = 0;
    for (int i = 0; i < 2000; ++i) x = x + i;
    in_use[static_cast<size_t>(t)].fetch_sub(1);
  });
  EXPECT_EQ(clashes.load(), 0);
}

TEST(ThreadPool, RejectsZeroThreads) { EXPECT_THROW(ThreadPool(0), Error); }

}  // namespace
}  // namespace specula
