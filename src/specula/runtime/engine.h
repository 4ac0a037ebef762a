// Engine: the API in front of the scheduler, for the CLI, benchmarks and the HTTP server.
// Thread-safe: submit, cancel and stats may be called from any thread. By default a background
// thread runs scheduler steps whenever there is work; with background_thread = false the caller
// drives it with step() / run_until_idle() (deterministic tests, offline batches).
//
// Each submitted request gets a RequestHandle: chunks of tokens and final text stream into it (and
// into an optional callback, called on the stepping thread), wait() blocks until it finishes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "specula/core/error_base.h"
#include "specula/model/tokenizer.h"
#include "specula/runner/model_runner.h"
#include "specula/runtime/request.h"
#include "specula/runtime/scheduler.h"

namespace specula {

// Thrown by Engine::submit when the request is fine but cannot be taken now (the queue is full,
// the engine is shutting down): a server answers 503 and the client may retry.
class EngineBusy : public Error {
 public:
  using Error::Error;
};

struct EngineOptions {
  ModelRunnerOptions runner;
  SchedulerOptions scheduler;
  // EAGLE / EAGLE-3 speculative decoding with this draft head (with the auto policy, steps the
  // policy runs without drafting are plain DECODE steps, through the decode graphs).
  std::optional<EagleOptions> speculative;
  // The auto policy's start-up calibration on a GPU (tests that time nothing turn it off).
  bool speculative_calibration = true;
  bool background_thread = true;
};

class RequestHandle {
 public:
  uint64_t id() const { return id_; }
  // The next chunk, blocking until there is one; nullopt once the finished chunk was taken.
  std::optional<StreamChunk> next();
  // Blocks until the request finishes and returns its output.
  RequestOutput wait();
  bool finished() const;

 private:
  friend class Engine;
  explicit RequestHandle(uint64_t id) : id_(id) {}
  void push(const StreamChunk& chunk);

  uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamChunk> chunks_;
  std::optional<RequestOutput> output_;
  bool drained_ = false;
};

class Engine {
 public:
  // A Hugging Face model folder (config.json, safetensors, tokenizer.json).
  Engine(const std::filesystem::path& model_dir, const EngineOptions& options);
  // Any weight source, and no tokenizer (token ids in and out; stop strings and text prompts are
  // refused) or the one given.
  Engine(const ModelConfig& config, const WeightSource& weights, const EngineOptions& options,
         std::unique_ptr<Tokenizer> tokenizer = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates the request (throws specula::Error naming the bad value, or when the queue is full)
  // and queues it. on_chunk, if given, is called on the stepping thread for every chunk; it must
  // not call back into this engine's step(), run_until_idle() or flush_cache() (deadlock), and
  // an exception it throws is reported on stderr and otherwise ignored.
  std::shared_ptr<RequestHandle> submit(EngineRequest request, StreamCallback on_chunk = {});
  // Asks for a request to end (it finishes with reason "cancelled" at the next step and its KV is
  // released); false for an id this engine never issued. A finished request is not affected.
  bool cancel(uint64_t id);
  SchedulerStats stats() const;

  // Without the background thread: one step (false when there was nothing to do) / steps until
  // every submitted request has finished.
  bool step();
  void run_until_idle();
  // Frees every prefix-cache page; only while no request runs (tests, benchmarks).
  void flush_cache();

  const ModelConfig& config() const { return runner_->config(); }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  ModelRunner& runner() { return *runner_; }
  const EagleWorker* speculative_worker() const { return spec_.get(); }
  EagleWorker* speculative_worker() { return spec_.get(); }

 private:
  void init(const ModelConfig& config, const WeightSource& weights);
  // Moves submitted requests and cancellations into the scheduler (stepping thread only).
  void drain_inbox();
  bool step_locked();
  void loop();

  EngineOptions options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<EagleWorker> spec_;
  std::unique_ptr<Scheduler> scheduler_;

  struct Submitted {
    uint64_t id;
    EngineRequest request;
    StreamCallback on_chunk;
    std::shared_ptr<RequestHandle> handle;
    std::chrono::steady_clock::time_point submitted;
  };
  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::deque<Submitted> inbox_;
  std::vector<uint64_t> cancels_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> queued_{0};  // waiting in the scheduler, as of the last step, plus the inbox
  bool stopping_ = false;

  std::mutex step_mu_;  // one stepping thread at a time
  mutable std::mutex stats_mu_;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace specula
