// ThreadPool implementation: a generation counter wakes the workers for each job; items are
// claimed from an atomic counter.
#include "specula/core/thread_pool.h"

#include <cstdlib>
#include <string>

#include "specula/core/error.h"

namespace specula {

namespace {
// The pool whose item this thread is running (if any) and this thread's index in it: a nested
// parallel_for on the same pool runs inline under the same index, so per-thread scratch stays
// private to one thread.
thread_local const ThreadPool* t_pool = nullptr;
thread_local int t_index = 0;
}

ThreadPool::ThreadPool(int num_threads) {
  SPECULA_CHECK(num_threads >= 1, "thread count {} is not valid; it must be at least 1", num_threads);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_items(int thread_index) {
  for (;;) {
    const int64_t item = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (item >= job_items_) return;
    try {
      (*job_)(item, thread_index);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_item_.store(job_items_, std::memory_order_relaxed);  // stop handing out work
      return;
    }
  }
}

void ThreadPool::worker_loop(int thread_index) {
  t_pool = this;
  t_index = thread_index;
  uint64_t seen_generation = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
    }
    run_items(thread_index);
    {
      std::lock_guard lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t num_items, const std::function<void(int64_t, int)>& fn) {
  if (num_items <= 0) return;
  if (t_pool == this) {
    for (int64_t i = 0; i < num_items; ++i) fn(i, t_index);
    return;
  }
  if (workers_.empty() || num_items == 1) {
    for (int64_t i = 0; i < num_items; ++i) fn(i, 0);
    return;
  }
  std::lock_guard call_lock(call_mutex_);
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_items_ = num_items;
    next_item_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    busy_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  const ThreadPool* outer_pool = t_pool;
  const int outer_index = t_index;
  t_pool = this;
  t_index = 0;
  run_items(0);
  t_pool = outer_pool;
  t_index = outer_index;
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return busy_workers_ == 0; });
    job_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

ThreadPool& default_thread_pool() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("SPECULA_NUM_THREADS")) {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      SPECULA_CHECK(end != env && *end == '\0' && n >= 1 && n <= 4096, "SPECULA_NUM_THREADS='{}' is not valid; expected a positive integer", env);
      return static_cast<int>(n);
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }());
  return pool;
}

}  // namespace specula
