// Engine implementation: an inbox guarded by a mutex between the callers' threads and the one
// stepping thread, which alone touches the scheduler.
#include "specula/runtime/engine.h"

#include <algorithm>
#include <cstdio>
#include <future>
#include <system_error>

#include "specula/core/error.h"
#include "specula/model/safetensors.h"
#include "specula/runner/sampler.h"
#include "specula/speculative/spec_calibration.h"

namespace specula {

std::optional<StreamChunk> RequestHandle::next() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !chunks_.empty() || drained_; });
  if (chunks_.empty()) return std::nullopt;
  StreamChunk c = std::move(chunks_.front());
  chunks_.pop_front();
  // The finished chunk's output pointer is only valid during the callback; point it at our copy.
  if (c.finished) {
    c.output = &*output_;
    drained_ = true;
  }
  return c;
}

RequestOutput RequestHandle::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return output_.has_value(); });
  return *output_;
}

bool RequestHandle::finished() const {
  std::lock_guard lk(mu_);
  return output_.has_value();
}

void RequestHandle::push(const StreamChunk& chunk) {
  {
    std::lock_guard lk(mu_);
    chunks_.push_back(chunk);
    chunks_.back().output = nullptr;
    if (chunk.finished) output_ = *chunk.output;
  }
  cv_.notify_all();
}

Engine::Engine(const std::filesystem::path& model_dir, const EngineOptions& options) : options_(options) {
  SPECULA_CHECK(std::filesystem::is_directory(model_dir), "model folder '{}' does not exist", model_dir.string());
  const ModelConfig config = load_model_config(model_dir);
  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_folder(model_dir));
  // The checkpoint's mapping is released once the model holds its own copy of the weights.
  const Checkpoint checkpoint(model_dir);
  init(config, checkpoint);
}

Engine::Engine(const ModelConfig& config, const WeightSource& weights, const EngineOptions& options,
               std::unique_ptr<Tokenizer> tokenizer)
    : options_(options), tokenizer_(std::move(tokenizer)) {
  init(config, weights);
}

void Engine::init(const ModelConfig& config, const WeightSource& weights) {
  if (options_.speculative) {
    options_.speculative->params.validate();
    options_.runner.cuda_graph_verify_tokens = options_.speculative->params.num_draft_tokens;
    options_.runner.spec_scratch_tokens = options_.speculative->params.scratch_tokens();
  }
  SPECULA_CHECK(!options_.speculative || !config.is_mla(),
                "speculative decoding (EAGLE) needs a Llama-family target; {} uses multi-head latent attention",
                config.architecture);
  // The grammar vocabulary builds on a core of its own while the weights load and the graphs are
  // captured (seconds), so it is ready before the first constrained request. If this function
  // throws, the future's destructor waits for the build, which reads only the tokenizer.
  std::future<std::shared_ptr<const grammar::Vocabulary>> vocabulary;
  if (tokenizer_ != nullptr && options_.scheduler.prepare_grammar_vocabulary) {
    try {
      vocabulary = std::async(std::launch::async, [tok = tokenizer_.get(), vocab_size = config.vocab_size] {
        return grammar_vocabulary(*tok, vocab_size);
      });
    } catch (const std::system_error&) {
      // No thread to spare: the first constrained request builds it.
    }
  }
  runner_ = std::make_unique<ModelRunner>(config, weights, options_.runner);
  SPECULA_ASSERT(runner_->config().vocab_size == config.vocab_size);
  // The model's config says whether dual chunk attention is in force for the contexts admitted.
  SPECULA_CHECK(!options_.speculative || !runner_->config().dual_chunk.enabled(),
                "speculative decoding with dual chunk attention is not supported; --max-context-len {} or less runs "
                "{} as plain attention",
                runner_->config().dual_chunk.chunk_len(), config.architecture);
  if (options_.speculative) {
    spec_ = std::make_unique<EagleWorker>(*runner_, *options_.speculative);
    // On a GPU the auto policy starts from cycles timed now (about a second); on the CPU from
    // the first cycles it runs.
    if (options_.runner.device.is_cuda() && options_.speculative_calibration) {
      calibrate_policy(*spec_, *runner_, SpecTimingOptions{{}, std::min(256, runner_->max_context_len() / 2), 1, 2, 1});
    }
  }
  scheduler_ =
      std::make_unique<Scheduler>(*runner_, tokenizer_.get(), options_.scheduler, spec_.get(), std::move(vocabulary));
  stats_ = scheduler_->stats();
  if (options_.background_thread) thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(inbox_mu_);
    stopping_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Whatever is still queued or running ends as cancelled, so no waiter is left hanging.
  std::lock_guard stepping(step_mu_);
  drain_inbox();
  scheduler_->cancel_all("cancelled");
}

std::shared_ptr<RequestHandle> Engine::submit(EngineRequest request, StreamCallback on_chunk) {
  scheduler_->validate(request);
  std::shared_ptr<RequestHandle> handle;
  {
    std::lock_guard lk(inbox_mu_);
    if (stopping_) throw EngineBusy("the engine is shutting down");
    if (queued_.load() >= options_.scheduler.max_queued_requests) {
      throw EngineBusy(fmt::format("the queue is full ({} requests waiting, max_queued_requests {}); try again later",
                                   queued_.load(), options_.scheduler.max_queued_requests));
    }
    const uint64_t id = next_id_++;
    handle.reset(new RequestHandle(id));
    inbox_.push_back({id, std::move(request), std::move(on_chunk), handle, std::chrono::steady_clock::now()});
    ++queued_;
  }
  inbox_cv_.notify_all();
  return handle;
}

bool Engine::cancel(uint64_t id) {
  {
    std::lock_guard lk(inbox_mu_);
    if (id == 0 || id >= next_id_.load()) return false;
    cancels_.push_back(id);
  }
  inbox_cv_.notify_all();
  return true;
}

void Engine::drain_inbox() {
  std::deque<Submitted> inbox;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard lk(inbox_mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (Submitted& s : inbox) {
    StreamCallback cb = [handle = s.handle, user = std::move(s.on_chunk)](const StreamChunk& chunk) {
      // A throwing callback is the caller's problem; the request and its handle go on.
      try {
        if (user) user(chunk);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "specula: request %llu: stream callback threw: %s\n",
                     static_cast<unsigned long long>(chunk.id), e.what());
      }
      handle->push(chunk);
    };
    try {
      scheduler_->submit(s.id, std::move(s.request), cb, s.submitted);
    } catch (const std::exception& e) {
      // The request ends here, and its caller hears so through the same callback as any end.
      RequestOutput out;
      out.id = s.id;
      out.finish_reason = std::string("error: ") + e.what();
      StreamChunk c;
      c.id = s.id;
      c.finished = true;
      c.output = &out;
      cb(c);
    }
  }
  for (uint64_t id : cancels) scheduler_->cancel(id);
}

bool Engine::step_locked() {
  drain_inbox();
  bool worked = false;
  try {
    worked = scheduler_->step();
  } catch (const std::exception& e) {
    // The scheduler's own state can no longer be trusted: every request ends with the reason.
    std::fprintf(stderr, "specula: scheduler step failed: %s\n", e.what());
    scheduler_->cancel_all(std::string("error: ") + e.what());
    worked = true;
  }
  const SchedulerStats s = scheduler_->stats();
  {
    std::lock_guard lk(inbox_mu_);
    queued_ = s.waiting + static_cast<int>(inbox_.size());
  }
  std::lock_guard lk(stats_mu_);
  stats_ = s;
  return worked;
}

bool Engine::step() {
  SPECULA_CHECK(!options_.background_thread, "step() drives an engine without a background thread");
  std::lock_guard lk(step_mu_);
  return step_locked();
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

void Engine::flush_cache() {
  std::lock_guard lk(step_mu_);
  SPECULA_CHECK(!scheduler_->has_work(), "flush_cache: requests are still running");
  scheduler_->flush_cache();
  std::lock_guard s(stats_mu_);
  stats_ = scheduler_->stats();
}

SchedulerStats Engine::stats() const {
  std::lock_guard lk(stats_mu_);
  return stats_;
}

void Engine::loop() {
  while (true) {
    {
      std::unique_lock lk(inbox_mu_);
      inbox_cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || queued_ > 0; });
      if (stopping_) return;
    }
    std::lock_guard stepping(step_mu_);
    // Runs until the scheduler has nothing left, then sleeps until the next submission.
    while (step_locked()) {
      std::lock_guard lk(inbox_mu_);
      if (stopping_) return;
    }
  }
}

}  // namespace specula
