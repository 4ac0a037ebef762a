// MaskWarmer.
#include "specula/grammar/mask_warmer.h"

#include <exception>

#include "specula/core/error.h"

namespace specula::grammar {

MaskWarmer::MaskWarmer(double seconds) : seconds_(seconds) {
  SPECULA_CHECK(seconds > 0, "grammar warm-up budget {} s is not valid; it must be > 0", seconds);
}

MaskWarmer::~MaskWarmer() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void MaskWarmer::add(const std::shared_ptr<TokenMasker>& masker) {
  {
    const std::lock_guard lock(mutex_);
    queue_.push_back(masker);
    if (queue_.size() > kMaxQueued) queue_.pop_front();
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

void MaskWarmer::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return (queue_.empty() && !busy_) || stop_; });
}

void MaskWarmer::run() {
  for (;;) {
    std::shared_ptr<TokenMasker> masker;
    uint64_t seed = 0;
    {
      std::unique_lock lock(mutex_);
      busy_ = false;
      idle_.notify_all();
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      masker = queue_.front().lock();
      queue_.pop_front();
      busy_ = true;
      seed = seed_++;
    }
    // Only a speed-up: a warm-up that fails (out of memory) leaves the masker as it was.
    try {
      if (masker != nullptr) masks_ += masker->warm_up(seconds_, seed, &stop_);
    } catch (const std::exception&) {
    }
  }
}

}  // namespace specula::grammar
