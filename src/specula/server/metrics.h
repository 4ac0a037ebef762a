// Server metrics in the Prometheus text exposition format (version 0.0.4): request counters by
// endpoint and status, token counters, latency histograms (time to first token, inter-token
// latency, end-to-end latency), and the engine's gauges (running and queued requests, KV-cache
// usage, prefix-cache hit rate, speculative accept length). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "specula/runtime/scheduler.h"

namespace specula::server {

// Cumulative buckets over fixed upper bounds, as Prometheus histograms are.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket / _sum / _count lines of `name`.
  void render(std::string& out, const std::string& name) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // A finished HTTP request (any endpoint, any status).
  void request_done(const std::string& endpoint, int status);
  // A finished generation (one choice): its tokens and times in seconds from submission.
  void generation_done(int prompt_tokens, int cached_tokens, int completion_tokens, double time_to_first_token_s,
                       const std::vector<double>& token_times_s, double latency_s);
  // The whole text, with the engine's gauges as of `stats`.
  std::string render(const SchedulerStats& stats, const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
};

}  // namespace specula::server
