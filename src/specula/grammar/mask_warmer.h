// MaskWarmer: classifies new grammars' keys in the background (TokenMasker::warm_up), so that a
// new schema's first decode steps find most of their masks cached, as xgrammar's compile-time
// precomputation gives. One worker thread, started with the first grammar; grammars wait in
// order (the oldest dropped past a bound), each warmed for at most a time budget; a masker
// nothing else holds any more is skipped. The destructor stops the worker at its next mask.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "specula/grammar/token_masker.h"

namespace specula::grammar {

class MaskWarmer {
 public:
  // seconds: each grammar's budget (> 0).
  explicit MaskWarmer(double seconds);
  ~MaskWarmer();
  MaskWarmer(const MaskWarmer&) = delete;
  MaskWarmer& operator=(const MaskWarmer&) = delete;

  void add(const std::shared_ptr<TokenMasker>& masker);
  // Blocks until every grammar added so far is warmed or skipped (tests and benchmarks).
  void wait_idle();
  int64_t masks_filled() const { return masks_.load(); }

  static constexpr size_t kMaxQueued = 16;

 private:
  void run();

  double seconds_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::weak_ptr<TokenMasker>> queue_;
  bool busy_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> masks_{0};
  uint64_t seed_ = 1;
  std::thread worker_;
};

}  // namespace specula::grammar
