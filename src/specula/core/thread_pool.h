// ThreadPool: a fixed set of workers for data-parallel loops (the CPU attention backend splits
// its (request, head, query-block) work items over it). The calling thread works too, and a
// parallel_for issued from inside a worker runs inline, so nesting cannot deadlock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specula {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means "run everything on the calling thread".
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(item, thread_index) for every item in [0, num_items), items handed out one at a
  // time (dynamic scheduling: attention work items differ a lot in cost). thread_index is in
  // [0, num_threads()) and lets callers keep per-thread scratch. Returns when all are done; the
  // first exception thrown by fn is rethrown here.
  void parallel_for(int64_t num_items, const std::function<void(int64_t item, int thread_index)>& fn);

 private:
  void worker_loop(int thread_index);
  void run_items(int thread_index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int)>* job_ = nullptr;
  int64_t job_items_ = 0;
  std::atomic<int64_t> next_item_{0};
  uint64_t generation_ = 0;
  int busy_workers_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::mutex call_mutex_;  // one parallel_for at a time per pool
};

// The process-wide pool: SPECULA_NUM_THREADS threads if set, else the hardware's count.
ThreadPool& default_thread_pool();

}  // namespace specula
