// Scheduler policy (scheduler.h): validation and queueing, which waiting requests are admitted
// each step and how much of their prompt runs, which running request a full KV cache pushes
// back out, the step's mode, and a request's end (stop conditions, streaming). The KV moves
// these decisions make are KvLedger's (request_kv.h).
#include "specula/runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "specula/core/error.h"
#include "specula/runner/sampler.h"
#include "specula/runtime/output_text.h"
#include "specula/runtime/scheduled_request.h"

namespace specula {

namespace {
using Clock = std::chrono::steady_clock;
// A waiting request that shares at least this many more tokens with a request admitted in the
// same step than the prefix cache gives it waits one step, so the shared part is computed once
// and then read from the cache (SGLang's in-batch prefix caching check).
constexpr int kInBatchPrefixThreshold = 32;
// Future output tokens of one request counted at most this far ahead at admission.
constexpr int kReserveClipTokens = 4096;
// The share of a request's remaining output tokens reserved at admission starts at this (times
// schedule_conservativeness), decays towards kMinNewTokenRatioFactor of it over
// kNewTokenRatioDecaySteps decode steps, and jumps back at every retraction (SGLang's values).
constexpr double kInitNewTokenRatio = 0.7;
constexpr double kMinNewTokenRatioFactor = 0.14;
constexpr double kNewTokenRatioDecaySteps = 600;
}  // namespace

Scheduler::Scheduler(ModelRunner& runner, const Tokenizer* tokenizer, const SchedulerOptions& options,
                     EagleWorker* spec, std::future<std::shared_ptr<const grammar::Vocabulary>> vocabulary)
    : runner_(runner), tokenizer_(tokenizer), vocabulary_build_(std::move(vocabulary)), spec_(spec), options_(options),
      kv_(runner, !options.disable_radix_cache, spec != nullptr),
      admission_groups_(options.speculative_admission_group) {
  SPECULA_CHECK(options_.max_queued_requests >= 1, "max_queued_requests {} is not valid; it must be >= 1",
                options_.max_queued_requests);
  SPECULA_CHECK(options_.chunked_prefill_size >= 0,
                "chunked_prefill_size {} is not valid; it must be >= 1, or 0 for no chunking",
                options_.chunked_prefill_size);
  SPECULA_CHECK(options_.schedule_conservativeness > 0, "schedule_conservativeness {} is not valid; it must be > 0",
                options_.schedule_conservativeness);
  SPECULA_CHECK(options_.grammar_warm_up_s >= 0 && options_.grammar_warm_up_s <= 60,
                "grammar_warm_up_s {} is not valid; it must be in [0, 60] seconds", options_.grammar_warm_up_s);
  new_token_ratio_ = initial_new_token_ratio();
  // A decode inside a MIXED step runs through the extend kernels, whose sums round differently
  // from the decode kernels': whether that happens depends on the other requests, so the
  // batch-invariant mode keeps decodes in steps of their own.
  if (runner_.options().deterministic) options_.enable_mixed_chunk = false;
  // A speculative cycle is a step of its own (draft, verify, draft extend).
  if (spec_ != nullptr) options_.enable_mixed_chunk = false;
}

Scheduler::~Scheduler() = default;

void Scheduler::validate(EngineRequest& r) const {
  const ModelConfig& c = runner_.config();
  if (r.prompt_ids.empty() && !r.prompt.empty()) {
    SPECULA_CHECK(tokenizer_ != nullptr, "a text prompt needs a tokenizer; this engine has none (give token ids)");
    r.prompt_ids = tokenizer_->encode(r.prompt);
  }
  const auto prompt_len = static_cast<int64_t>(r.prompt_ids.size());
  SPECULA_CHECK(prompt_len >= 1, "the prompt is empty");
  SPECULA_CHECK(prompt_len < runner_.max_context_len(), "the prompt has {} tokens; the context holds {}", prompt_len,
                runner_.max_context_len());
  for (int32_t id : r.prompt_ids) {
    SPECULA_CHECK(id >= 0 && id < c.vocab_size, "prompt token id {} is out of range [0, {})", id, c.vocab_size);
  }
  SPECULA_CHECK(r.max_new_tokens >= 0, "max_new_tokens {} is not valid; it must be >= 0", r.max_new_tokens);
  SPECULA_CHECK(r.logprobs >= -1 && r.logprobs <= kMaxTopLogprobs,
                "logprobs {} is not valid; it must be in [0, {}] (or -1: none)", r.logprobs, kMaxTopLogprobs);
  r.sampling.validate();
  if (r.format.constrained()) {
    SPECULA_CHECK(tokenizer_ != nullptr, "a {} response format needs the model's tokenizer, and this engine has none",
                  grammar::kind_name(r.format.kind));
    if (r.format.automaton == nullptr) grammar::compile(r.format);
  }
  // Builds (and so checks) the stop strings.
  OutputText check(tokenizer_, r.stop_strings);
}

void Scheduler::submit(uint64_t id, EngineRequest request, StreamCallback on_chunk, Clock::time_point submitted) {
  SPECULA_CHECK(static_cast<int>(waiting_.size()) < options_.max_queued_requests,
                "the queue is full ({} requests waiting, max_queued_requests {}); try again later", waiting_.size(),
                options_.max_queued_requests);
  auto r = std::make_unique<Req>(id, std::move(request), std::move(on_chunk), tokenizer_);
  const ModelConfig& c = runner_.config();
  r->stop_ids = r->params.stop_token_ids;
  if (!r->params.ignore_eos) r->stop_ids.insert(r->stop_ids.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());
  const auto prompt_len = static_cast<int>(r->params.prompt_ids.size());
  // A speculative cycle's scratch slots lie past max_context_len (ModelRunner::kv_capacity), so
  // the output is bounded by the context alone, with or without speculation.
  SPECULA_ASSERT(spec_ == nullptr || runner_.kv_capacity() - runner_.max_context_len() >= spec_->scratch_tokens());
  r->max_new_tokens = std::max(0, std::min(r->params.max_new_tokens, runner_.max_context_len() - prompt_len));
  r->sampler.observe_prompt(r->params.prompt_ids);
  if (r->params.format.constrained()) {
    SPECULA_CHECK(tokenizer_ != nullptr, "a {} response format needs the model's tokenizer, and this engine has none",
                  grammar::kind_name(r->params.format.kind));
    if (r->params.format.automaton == nullptr) grammar::compile(r->params.format);
    r->sampler.constrain(std::make_unique<grammar::TokenConstraint>(masker_for(r->params.format), r->stop_ids));
  }
  r->submitted = submitted;
  r->out.id = id;
  r->out.prompt_ids = r->params.prompt_ids;
  waiting_.push_back(std::move(r));
}

const std::shared_ptr<const grammar::Vocabulary>& Scheduler::vocabulary() {
  if (vocabulary_ == nullptr) {
    // A build that failed (out of memory) rethrows here and fails only the request that asked.
    if (vocabulary_build_.valid()) {
      vocabulary_ = vocabulary_build_.get();
    } else {
      vocabulary_ = grammar_vocabulary(*tokenizer_, runner_.config().vocab_size);
    }
  }
  return vocabulary_;
}

std::shared_ptr<grammar::TokenMasker> Scheduler::masker_for(const grammar::OutputFormat& format) {
  std::string key(grammar::kind_name(format.kind));
  key += '\n';
  key += format.source;
  for (auto it = maskers_.begin(); it != maskers_.end(); ++it) {
    if (it->first == key) {
      maskers_.splice(maskers_.begin(), maskers_, it);
      return maskers_.front().second;
    }
  }
  maskers_.emplace_front(std::move(key), std::make_shared<grammar::TokenMasker>(format.automaton, vocabulary()));
  if (maskers_.size() > kMaxMaskers) maskers_.pop_back();
  if (options_.grammar_warm_up_s > 0) {
    if (warmer_ == nullptr) warmer_ = std::make_unique<grammar::MaskWarmer>(options_.grammar_warm_up_s);
    warmer_->add(maskers_.front().second);
  }
  return maskers_.front().second;
}

bool Scheduler::cancel(uint64_t id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id != id) continue;
    finish(**it, "cancelled");
    waiting_.erase(it);
    return true;
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->id != id) continue;
    finish(**it, "cancelled");
    running_.erase(it);
    return true;
  }
  return false;
}

void Scheduler::cancel_all(const std::string& reason) {
  for (auto& r : waiting_) finish(*r, reason);
  for (auto& r : running_) finish(*r, reason);
  waiting_.clear();
  running_.clear();
}

double Scheduler::initial_new_token_ratio() const {
  return std::min(1.0, kInitNewTokenRatio * options_.schedule_conservativeness);
}

void Scheduler::retract(Req& r) {
  const int kv = r.kv_len();
  admission_kv_limited_ = true;
  kv_.release(r.kv, r.fill(), /*cache_kv=*/true);
  ++r.out.retractions;
  ++stats_.retractions;
  new_token_ratio_ = initial_new_token_ratio();
  if (options_.log_retractions) {
    std::fprintf(stderr, "specula: KV cache full: request %llu retracted (%d tokens of KV released; recomputed later)\n",
                 static_cast<unsigned long long>(r.id), kv);
  }
}

int64_t Scheduler::reserved_tokens() const {
  int64_t reserved = 0;
  for (const auto& r : running_) {
    if (r->pending() > 1) reserved += r->pending();
    reserved += static_cast<int64_t>(std::min(r->remaining_new_tokens(), kReserveClipTokens) * new_token_ratio_);
  }
  return reserved;
}

std::vector<std::unique_ptr<Scheduler::Req>>::iterator Scheduler::retraction_victim() {
  // The request with the fewest output tokens first (the least decoding redone), then the longest
  // prompt (the most KV freed); the earliest running of equals. SGLang's order.
  return std::min_element(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
    if (a->out.output_ids.size() != b->out.output_ids.size()) return a->out.output_ids.size() < b->out.output_ids.size();
    return a->params.prompt_ids.size() > b->params.prompt_ids.size();
  });
}

std::vector<Scheduler::Planned> Scheduler::schedule_decodes(int tokens) {
  auto is_decoding = [](const Req& r) { return r.pending() == 1; };
  // Free pages for every decoding request's next tokens: evict cached pages, then retract.
  while (true) {
    int64_t need = 0;
    for (const auto& r : running_) {
      if (is_decoding(*r)) need += kv_.new_pages(r->kv_len(), tokens);
    }
    if (kv_.ensure_free_pages(need)) break;
    SPECULA_CHECK(running_.size() > 1,
                  "the KV cache cannot hold the next {} token(s) of the only running request ({} tokens of KV): "
                  "they need {} new page(s) of {} tokens; {} of the cache's {} pages are free",
                  tokens, running_.front()->kv_len(), need, kv_.page_size(), kv_.free_tokens() / kv_.page_size(),
                  kv_.total_tokens() / kv_.page_size());
    auto victim = retraction_victim();
    retract(**victim);
    waiting_.push_front(std::move(*victim));
    running_.erase(victim);
  }
  std::vector<Planned> plan;
  for (const auto& r : running_) {
    if (!is_decoding(*r)) continue;
    if (spec_ == nullptr) {
      const bool allocated = kv_.alloc_decode(r->kv);
      SPECULA_ASSERT(allocated, "pages were made free for every decoding request");
    } else {
      kv_.alloc_scratch(r->kv, tokens);
    }
    plan.push_back({r.get(), 1});
  }
  return plan;
}

bool Scheduler::waits_for_in_batch_prefix(const Req& r, const std::vector<const Req*>& admitted) const {
  if (kv_.cache() == nullptr || r.fill_len() <= r.kv.prefix_len + kInBatchPrefixThreshold) return false;
  for (const Req* q : admitted) {
    int common = 0;
    const int n = std::min(r.fill_len(), q->fill_len());
    while (common < n && r.fill_id(common) == q->fill_id(common)) ++common;
    // Under speculation the cache shares a position only with the token after it (bigram keys).
    const int shareable = spec_ != nullptr ? common - 1 : common;
    if (shareable >= r.kv.prefix_len + kInBatchPrefixThreshold) return true;
  }
  return false;
}

bool Scheduler::defer_admission() {
  const auto admit = [this] {
    admission_groups_.admit();
    return false;
  };
  // The KV cache, not rows, limits admission: free rows would wait for a group that cannot come.
  if (running_.empty() || waiting_.empty() || admission_kv_limited_) return admit();
  // A retracted request (its client may have seen tokens already) and one that needs no row go
  // at once.
  const Req& head = *waiting_.front();
  if (head.out.retractions > 0 || head.max_new_tokens == 0) return admit();
  // A prompt still being prefilled in chunks makes this step a prefill step anyway.
  for (const auto& r : running_) {
    if (r->pending() > 1) return admit();
  }
  const int busy = static_cast<int>(running_.size());
  const int free_rows = std::max(runner_.options().max_running_requests - busy, 0);
  const auto queued = static_cast<int64_t>(waiting_.size());
  // Near a full queue: new requests would be refused while rows that could take some stay free.
  if (queued + free_rows >= options_.max_queued_requests) return admit();
  const bool wait = admission_groups_.defer(free_rows, queued, busy);
  if (wait) ++stats_.admission_deferred_steps;
  return wait;
}

std::vector<Scheduler::Planned> Scheduler::schedule_prefills(int budget, int decodes) {
  std::vector<Planned> plan;
  const bool chunking = options_.chunked_prefill_size > 0;
  // Prompts already being prefilled in chunks go first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Req& r = *running_[i];
    if (r.pending() <= 1) continue;
    const int extend = chunking ? std::min(r.pending(), budget) : r.pending();
    if (!kv_.alloc_extend(r.kv, extend)) {
      retract(r);
      waiting_.push_front(std::move(running_[i]));
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      --i;
      continue;
    }
    plan.push_back({&r, extend});
    budget -= extend;
  }
  const int max_running = runner_.options().max_running_requests;
  int64_t reserved = reserved_tokens();
  admission_kv_limited_ = false;
  std::vector<const Req*> admitted;
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0;) {
    if (static_cast<int>(running_.size()) >= max_running) break;
    Req& r = **it;
    if (r.max_new_tokens == 0) {
      finish(r, "length");
      it = waiting_.erase(it);
      continue;
    }
    kv_.match_prefix(r.kv, r.fill());
    if (waits_for_in_batch_prefix(r, admitted)) {
      kv_.unlock_prefix(r.kv);
      ++it;
      continue;
    }
    const int extend = chunking ? std::min(r.pending(), budget) : r.pending();
    // Its uncached prompt now, and the expected share of its output later.
    const int64_t need = kv_.whole_pages_tokens(r.pending()) +
                         static_cast<int64_t>(std::min(r.remaining_new_tokens(), kReserveClipTokens) * new_token_ratio_);
    const int64_t room = kv_.obtainable_tokens() - reserved;
    // The first request always fits an empty engine (the cache holds at least one full context).
    const bool engine_empty = running_.empty() && plan.empty() && decodes == 0;
    if (need > room && !engine_empty) {
      kv_.unlock_prefix(r.kv);
      admission_kv_limited_ = true;
      break;
    }
    kv_.take_row(r.kv);
    const int64_t allocated = kv_.new_pages(r.kv_len(), extend) * kv_.page_size();
    if (!kv_.alloc_extend(r.kv, extend)) {
      kv_.release(r.kv, r.fill(), /*cache_kv=*/true);
      admission_kv_limited_ = true;
      break;
    }
    if (!r.admitted_once) {
      r.admitted_once = true;
      // A new request expects the engine's acceptance so far until its own cycles say otherwise:
      // as of now, when it starts, not when it arrived. Requests queued at once all took the
      // start-up prior (3.1 tokens a (7, 8) cycle where the engine's cycles gave 5.5), so each
      // began on short chains (on the VM, its first 10 cycles' estimate averaged 3.4 tokens
      // against 4.4 emitted).
      if (spec_ != nullptr) r.acceptance.seed(spec_->policy().acceptance());
      r.out.cached_tokens = r.kv.prefix_len;
      stats_.cached_tokens += r.kv.prefix_len;
      stats_.prompt_tokens += static_cast<int64_t>(r.params.prompt_ids.size());
    }
    // The pages just allocated already left the free count that `room` starts from: only the rest
    // of the request's need stays reserved.
    reserved += need - allocated;
    budget -= extend;
    admitted.push_back(&r);
    plan.push_back({&r, extend});
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
  return plan;
}

bool Scheduler::step() {
  if (!has_work()) return false;
  const auto start = Clock::now();
  emit_s_ = 0;
  const int budget = options_.chunked_prefill_size > 0 ? options_.chunked_prefill_size : std::numeric_limits<int>::max();
  std::vector<Planned> plan;
  ForwardMode mode = ForwardMode::EXTEND;
  if (options_.enable_mixed_chunk) {
    std::vector<Planned> decodes = schedule_decodes();
    plan = schedule_prefills(std::max(budget - static_cast<int>(decodes.size()), 1), static_cast<int>(decodes.size()));
    if (plan.empty()) mode = ForwardMode::DECODE;
    else if (!decodes.empty()) mode = ForwardMode::MIXED;
    // Prefill rows first, then decodes (the order SGLang's mixed batches use).
    plan.insert(plan.end(), decodes.begin(), decodes.end());
  } else {
    if (spec_ == nullptr || !defer_admission()) plan = schedule_prefills(budget, 0);
    if (plan.empty()) {
      plan = schedule_decodes(spec_ != nullptr ? spec_->scratch_tokens() : 1);
      mode = ForwardMode::DECODE;
    }
  }
  if (!plan.empty() && mode == ForwardMode::DECODE && spec_ != nullptr) {
    run_spec_cycle(plan, start);
    // Rows a failed cycle ended are not the steady rate at which rows free.
    const auto freed = std::count_if(running_.begin(), running_.end(), [](const auto& r) {
      return r->done && !r->out.finish_reason.starts_with("error");
    });
    admission_groups_.observe_decode(std::chrono::duration<double>(Clock::now() - start).count(),
                                     static_cast<int>(freed));
  } else if (!plan.empty()) {
    const bool ran = run_batch(plan, mode);
    if (ran && mode == ForwardMode::EXTEND) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      ++stats_.prefill_only_steps;
      stats_.prefill_only_s += seconds;
      stats_.prefill_only_forward_s += batch_forward_s_;
      stats_.prefill_only_draft_extend_s += batch_draft_extend_s_;
      if (spec_ != nullptr) {
        int64_t tokens = 0;
        for (const Planned& p : plan) tokens += p.extend;
        admission_groups_.observe_prefill(tokens, seconds);
      }
    }
    if (ran && (mode == ForwardMode::DECODE || mode == ForwardMode::MIXED)) {
      // Each decode step that ran lowers the share of future tokens reserved at admission.
      const double init = initial_new_token_ratio();
      const double floor = init * kMinNewTokenRatioFactor;
      new_token_ratio_ = std::max(floor, new_token_ratio_ - (init - floor) / kNewTokenRatioDecaySteps);
    }
  } else if (running_.empty() && !waiting_.empty()) {
    // Not even an empty engine could take the next request (the KV cache is smaller than it
    // needs, or slots went missing): it ends with the reason instead of waiting forever.
    Req& r = *waiting_.front();
    finish(r, fmt::format("error: the KV cache ({} free tokens) cannot hold this request's {} tokens",
                          kv_.free_tokens(), r.fill_len()));
    waiting_.pop_front();
  }
  std::erase_if(running_, [](const auto& r) { return r->done; });
  ++stats_.steps;
  return true;
}

void Scheduler::process_token(Req& r, int32_t token) {
  const auto now = Clock::now();
  struct Timed {  // adds this call's seconds to emit_s_ however it returns
    double& total;
    Clock::time_point start;
    ~Timed() { total += std::chrono::duration<double>(Clock::now() - start).count(); }
  } timed{emit_s_, now};
  r.out.output_ids.push_back(token);
  const double t = std::chrono::duration<double>(now - r.submitted).count();
  r.out.token_times_s.push_back(t);
  if (r.out.output_ids.size() == 1) r.out.time_to_first_token_s = t;
  ++stats_.decode_tokens;
  // A stop token ends the output without adding its text (as SGLang trims it).
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) return finish(r, "stop");
  if (r.text.push(token)) return finish(r, "stop");
  // The grammar admits nothing more (an end token is all it would take next).
  if (r.sampler.grammar_terminated()) return finish(r, "stop");
  if (static_cast<int>(r.out.output_ids.size()) >= r.max_new_tokens) return finish(r, "length");
  publish(r, false);
}

void Scheduler::finish(Req& r, std::string reason, bool cache_kv) {
  if (r.text.finish() && reason == "length") reason = "stop";
  r.out.text = r.text.text();
  r.out.finish_reason = std::move(reason);
  r.out.latency_s = std::chrono::duration<double>(Clock::now() - r.submitted).count();
  kv_.release(r.kv, r.fill(), cache_kv);
  r.done = true;
  ++stats_.finished;
  publish(r, true);
}

void Scheduler::publish(Req& r, bool finished) {
  StreamChunk chunk;
  chunk.id = r.id;
  chunk.token_ids.assign(r.out.output_ids.begin() + static_cast<std::ptrdiff_t>(r.streamed_tokens), r.out.output_ids.end());
  if (!r.out.logprobs.empty()) {
    chunk.logprobs.assign(r.out.logprobs.begin() + static_cast<std::ptrdiff_t>(r.streamed_tokens), r.out.logprobs.end());
  }
  r.streamed_tokens = r.out.output_ids.size();
  chunk.text = std::string(r.text.take_final());
  chunk.finished = finished;
  if (finished) chunk.output = &r.out;
  if (r.on_chunk) r.on_chunk(chunk);
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = stats_;
  s.running = static_cast<int>(running_.size());
  s.waiting = static_cast<int>(waiting_.size());
  s.admission_group = admission_groups_.last_group();
  s.admission_fixed_s = admission_groups_.fixed_seconds();
  s.admission_cycle_s = admission_groups_.cycle_seconds();
  s.admission_rows_freed_per_cycle = admission_groups_.rows_freed_per_cycle();
  s.kv_free_tokens = kv_.free_tokens();
  s.kv_cached_tokens = kv_.cached_tokens();
  s.kv_total_tokens = kv_.total_tokens();
  return s;
}

void Scheduler::flush_cache() { kv_.flush_cache(); }

}  // namespace specula
