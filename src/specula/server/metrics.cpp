// Prometheus text rendering.
#include "specula/server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"

namespace specula::server {

namespace {

// Latency bounds in seconds: 1 ms to 5 minutes (vLLM's spread of buckets).
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
          40.0, 80.0, 160.0, 300.0};
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  return fmt::format("{}", v);
}

// A label value with backslash, double quote and newline escaped, as the format requires.
std::string label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  SPECULA_ASSERT(std::is_sorted(bounds_.begin(), bounds_.end()));
}

void Histogram::observe(double value) {
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[static_cast<size_t>(bucket)];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(bounds_[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(sum_), name, count_);
}

Metrics::Metrics() : ttft_(latency_bounds()), itl_(latency_bounds()), e2e_(latency_bounds()) {}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation_done(int prompt_tokens, int cached_tokens, int completion_tokens, double time_to_first_token_s,
                              const std::vector<double>& token_times_s, double latency_s) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += prompt_tokens;
  cached_tokens_ += cached_tokens;
  generation_tokens_ += completion_tokens;
  if (completion_tokens > 0) ttft_.observe(time_to_first_token_s);
  for (size_t i = 1; i < token_times_s.size(); ++i) itl_.observe(token_times_s[i] - token_times_s[i - 1]);
  e2e_.observe(latency_s);
}

std::string Metrics::render(const SchedulerStats& s, const std::string& model_name) const {
  std::lock_guard lk(mu_);
  std::string out;
  header(out, "specula_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, count] : requests_) {
    out += fmt::format("specula_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
  }
  header(out, "specula_num_requests_running", "gauge", "Requests in the running batch.");
  out += fmt::format("specula_num_requests_running {}\n", s.running);
  header(out, "specula_num_requests_waiting", "gauge", "Requests queued for admission.");
  out += fmt::format("specula_num_requests_waiting {}\n", s.waiting);
  header(out, "specula_kv_cache_usage_ratio", "gauge", "Fraction of KV-cache tokens in use by requests (not free, not cached).");
  const double total = static_cast<double>(std::max<int64_t>(1, s.kv_total_tokens));
  out += fmt::format("specula_kv_cache_usage_ratio {}\n",
                     number(static_cast<double>(s.kv_total_tokens - s.kv_free_tokens - s.kv_cached_tokens) / total));
  header(out, "specula_kv_cache_free_tokens", "gauge", "KV-cache tokens free in the allocator.");
  out += fmt::format("specula_kv_cache_free_tokens {}\n", s.kv_free_tokens);
  header(out, "specula_kv_cache_cached_tokens", "gauge", "KV-cache tokens held by the prefix cache (evictable).");
  out += fmt::format("specula_kv_cache_cached_tokens {}\n", s.kv_cached_tokens);
  header(out, "specula_kv_cache_total_tokens", "gauge", "KV-cache size in tokens.");
  out += fmt::format("specula_kv_cache_total_tokens {}\n", s.kv_total_tokens);
  header(out, "specula_prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / prompt tokens admitted.");
  out += fmt::format("specula_prefix_cache_hit_rate {}\n",
                     number(s.prompt_tokens > 0 ? static_cast<double>(s.cached_tokens) / static_cast<double>(s.prompt_tokens) : 0.0));
  header(out, "specula_prompt_tokens_total", "counter", "Prompt tokens of finished generations.");
  out += fmt::format("specula_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "specula_cached_prompt_tokens_total", "counter", "Prompt tokens of finished generations served from the prefix cache.");
  out += fmt::format("specula_cached_prompt_tokens_total {}\n", cached_tokens_);
  header(out, "specula_generation_tokens_total", "counter", "Tokens generated by finished generations.");
  out += fmt::format("specula_generation_tokens_total {}\n", generation_tokens_);
  header(out, "specula_time_to_first_token_seconds", "histogram", "Time from submission to the first output token.");
  ttft_.render(out, "specula_time_to_first_token_seconds");
  header(out, "specula_inter_token_latency_seconds", "histogram", "Time between consecutive output tokens.");
  itl_.render(out, "specula_inter_token_latency_seconds");
  header(out, "specula_e2e_request_latency_seconds", "histogram", "Time from submission to the last output token.");
  e2e_.render(out, "specula_e2e_request_latency_seconds");
  header(out, "specula_spec_verify_cycles_total", "counter", "Speculative verify cycles.");
  out += fmt::format("specula_spec_verify_cycles_total {}\n", s.spec_cycles);
  header(out, "specula_spec_accept_length", "gauge", "Mean tokens per speculative verify cycle (accepted draft tokens + 1).");
  out += fmt::format("specula_spec_accept_length {}\n",
                     number(s.spec_cycles > 0 ? static_cast<double>(s.spec_emitted_tokens) / static_cast<double>(s.spec_cycles) : 0.0));
  header(out, "specula_prefill_only_steps_total", "counter", "Steps that ran prompts alone (no decode rows).");
  out += fmt::format("specula_prefill_only_steps_total {}\n", s.prefill_only_steps);
  header(out, "specula_prefill_only_seconds_total", "counter", "Wall time of the steps that ran prompts alone.");
  out += fmt::format("specula_prefill_only_seconds_total {}\n", number(s.prefill_only_s));
  header(out, "specula_admission_deferred_steps_total", "counter",
         "Steps run without admitting while rows were free, waiting for a group (speculation).");
  out += fmt::format("specula_admission_deferred_steps_total {}\n", s.admission_deferred_steps);
  header(out, "specula_model_info", "gauge", "The served model.");
  out += fmt::format("specula_model_info{{model=\"{}\"}} 1\n", label(model_name));
  return out;
}

}  // namespace specula::server
