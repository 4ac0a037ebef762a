// Scheduler implementation. A request's "fill" is its prompt followed by its output so far; the
// KV of fill tokens [0, kv_len) exists (the first prefix_len of them are prefix-cache pages the
// request holds a lock on), and the model must still run tokens [kv_len, fill_len) before the
// next token can be sampled: many while prefilling, exactly one (the last output) while decoding.
#include "specula/runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "specula/core/error.h"
#include "specula/runtime/output_text.h"

namespace specula {

namespace {
using Clock = std::chrono::steady_clock;
// A waiting request that shares at least this many more tokens with a request admitted in the
// same step than the prefix cache gives it waits one step, so the shared part is computed once
// and then read from the cache (SGLang's in-batch prefix caching check).
constexpr int kInBatchPrefixThreshold = 32;
// Future output tokens of one request counted at most this far ahead at admission.
constexpr int kReserveClipTokens = 4096;
constexpr double kInitNewTokenRatio = 0.7;
constexpr double kMinNewTokenRatioFactor = 0.14;
constexpr double kNewTokenRatioDecaySteps = 600;
}  // namespace

struct Scheduler::Req {
  Req(uint64_t id_, EngineRequest params_, StreamCallback cb, const Tokenizer* tokenizer)
      : id(id_), params(std::move(params_)), on_chunk(std::move(cb)), sampler(params.sampling),
        text(tokenizer, params.stop_strings) {}

  uint64_t id;
  EngineRequest params;
  StreamCallback on_chunk;
  std::vector<int32_t> stop_ids;
  int max_new_tokens = 0;
  Sampler sampler;
  OutputText text;
  RequestOutput out;
  Clock::time_point submitted = Clock::now();
  size_t streamed_tokens = 0;
  bool admitted_once = false;
  bool done = false;

  int32_t req_pool_idx = -1;
  std::vector<int32_t> kv_slots;  // KV slots of fill tokens [0, kv_len)
  int prefix_len = 0;             // leading kv_slots owned by the prefix cache
  RadixNode* last_node = nullptr; // the matched node, locked while set
  // Speculative decoding: the draft KV exists for pairs [0, draft_len); the root's draft state;
  // the scratch slots of the running cycle (positions kv_len...).
  int draft_len = 0;
  DraftState draft;
  std::vector<int32_t> scratch;

  int kv_len() const { return static_cast<int>(kv_slots.size()); }
  int fill_len() const { return static_cast<int>(params.prompt_ids.size() + out.output_ids.size()); }
  int pending() const { return fill_len() - kv_len(); }
  int32_t fill_id(int i) const {
    const auto p = static_cast<int>(params.prompt_ids.size());
    return i < p ? params.prompt_ids[static_cast<size_t>(i)] : out.output_ids[static_cast<size_t>(i - p)];
  }
  std::vector<int32_t> fill(int n) const {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = fill_id(i);
    return ids;
  }
  int remaining_new_tokens() const { return max_new_tokens - static_cast<int>(out.output_ids.size()); }
};

Scheduler::Scheduler(ModelRunner& runner, const Tokenizer* tokenizer, const SchedulerOptions& options,
                     EagleWorker* spec)
    : runner_(runner), tokenizer_(tokenizer), spec_(spec), options_(options) {
  SPECULA_CHECK(options_.max_queued_requests >= 1, "max_queued_requests {} is not valid; it must be >= 1",
                options_.max_queued_requests);
  SPECULA_CHECK(options_.chunked_prefill_size >= 0,
                "chunked_prefill_size {} is not valid; it must be >= 1, or 0 for no chunking",
                options_.chunked_prefill_size);
  SPECULA_CHECK(options_.schedule_conservativeness > 0, "schedule_conservativeness {} is not valid; it must be > 0",
                options_.schedule_conservativeness);
  if (!options_.disable_radix_cache) cache_ = std::make_unique<RadixCache>(runner_.allocator(), runner_.page_size());
  new_token_ratio_ = std::min(1.0, kInitNewTokenRatio * options_.schedule_conservativeness);
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
  SPECULA_CHECK(spec_ == nullptr || r.logprobs < 0, "logprobs are not available with speculative decoding yet");
  r.sampling.validate();
  SPECULA_CHECK(spec_ == nullptr || (r.sampling.repetition_penalty == 1.0f && r.sampling.frequency_penalty == 0.0f &&
                                     r.sampling.presence_penalty == 0.0f),
                "repetition, frequency and presence penalties are not supported with speculative decoding");
  // Builds (and so checks) the stop strings.
  OutputText check(tokenizer_, r.stop_strings);
}

void Scheduler::submit(uint64_t id, EngineRequest request, StreamCallback on_chunk, Clock::time_point submitted) {
  SPECULA_CHECK(static_cast<int>(waiting_.size()) < options_.max_queued_requests,
                "the queue is full ({} requests waiting); try again later", waiting_.size());
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
  r->submitted = submitted;
  r->out.id = id;
  r->out.prompt_ids = r->params.prompt_ids;
  waiting_.push_back(std::move(r));
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

bool Scheduler::ensure_free_pages(int64_t pages) {
  PagedTokenAllocator& a = runner_.allocator();
  if (a.num_free_pages() >= pages) return true;
  if (cache_) cache_->evict((pages - a.num_free_pages()) * a.page_size());
  return a.num_free_pages() >= pages;
}

namespace {
int64_t pages_for(int64_t tokens, int page) { return (tokens + page - 1) / page; }
}  // namespace

bool Scheduler::alloc_extend(Req& r, int extend) {
  const int page = runner_.page_size();
  const int kv = r.kv_len();
  if (!ensure_free_pages(pages_for(kv + extend, page) - pages_for(kv, page))) return false;
  const int32_t prefix[] = {kv}, seq[] = {kv + extend}, last[] = {kv > 0 ? r.kv_slots.back() : -1};
  auto slots = runner_.allocator().alloc_extend(prefix, seq, last);
  SPECULA_ASSERT(slots.has_value());
  runner_.req_pool().write(r.req_pool_idx, kv, *slots);
  r.kv_slots.insert(r.kv_slots.end(), slots->begin(), slots->end());
  return true;
}

bool Scheduler::alloc_decode(Req& r) {
  const int kv = r.kv_len();
  if (!ensure_free_pages(kv % runner_.page_size() == 0 ? 1 : 0)) return false;
  const int32_t seq[] = {kv + 1}, last[] = {kv > 0 ? r.kv_slots.back() : -1};
  auto slot = runner_.allocator().alloc_decode(seq, last);
  SPECULA_ASSERT(slot.has_value());
  runner_.req_pool().write(r.req_pool_idx, kv, *slot);
  r.kv_slots.push_back((*slot)[0]);
  return true;
}

void Scheduler::match_prefix(Req& r) {
  r.prefix_len = 0;
  r.last_node = nullptr;
  r.kv_slots.clear();
  if (!cache_) return;
  // At least one token must run so that its logits give the next token.
  const std::vector<int32_t> key = r.fill(r.fill_len() - 1);
  RadixCache::Match m = cache_->match_prefix(key);
  if (spec_ != nullptr && !m.slots.empty()) {
    // The cached draft pair at the match's last position was computed with the next token of
    // whoever cached it, which may differ from ours: reuse only the whole pages before it.
    const int page = runner_.page_size();
    const int usable = (static_cast<int>(m.slots.size()) - 1) / page * page;
    m = cache_->match_prefix(std::vector<int32_t>(key.begin(), key.begin() + usable));
  }
  r.kv_slots = std::move(m.slots);
  r.prefix_len = r.kv_len();
  r.draft_len = r.prefix_len;
  r.last_node = m.last_node;
  cache_->inc_lock_ref(r.last_node);
}

int Scheduler::cacheable_len(const Req& r) const { return spec_ != nullptr ? std::min(r.kv_len(), r.draft_len) : r.kv_len(); }

void Scheduler::free_after(std::span<const int32_t> slots, int32_t last_kept) {
  const int page = runner_.page_size();
  std::vector<int32_t> pages;
  for (int32_t slot : slots) {
    if (last_kept >= 0 && slot / page == last_kept / page) continue;
    if (pages.empty() || pages.back() != slot / page) pages.push_back(slot / page);
  }
  for (int32_t& p : pages) p *= page;
  runner_.allocator().free(pages);
}

void Scheduler::release_kv(Req& r, bool cache_kv) {
  if (r.req_pool_idx < 0) return;
  PagedTokenAllocator& a = runner_.allocator();
  const int kv = r.kv_len();
  const int cacheable = cacheable_len(r);
  r.draft = {};
  r.draft_len = 0;
  if (cache_ && !cache_kv) {
    if (kv > r.prefix_len) a.free(std::span<const int32_t>(r.kv_slots).subspan(r.prefix_len));
    if (r.last_node != nullptr) cache_->dec_lock_ref(r.last_node);
  } else if (cache_) {
    const int aligned = cacheable / runner_.page_size() * runner_.page_size();
    int64_t overlap = 0;
    if (aligned > 0) {
      const std::vector<int32_t> key = r.fill(aligned);
      overlap = cache_->insert(key, std::span<const int32_t>(r.kv_slots.data(), static_cast<size_t>(aligned)));
    }
    // Slots the cache already had (computed twice) and the unaligned tail go back.
    SPECULA_ASSERT(overlap >= r.prefix_len);
    if (overlap > r.prefix_len) a.free(std::span<const int32_t>(r.kv_slots).subspan(r.prefix_len, overlap - r.prefix_len));
    if (kv > aligned) a.free(std::span<const int32_t>(r.kv_slots).subspan(aligned));
    if (r.last_node != nullptr) cache_->dec_lock_ref(r.last_node);
  } else if (kv > 0) {
    a.free(r.kv_slots);
  }
  runner_.req_pool().free(r.req_pool_idx);
  r.req_pool_idx = -1;
  r.kv_slots.clear();
  r.prefix_len = 0;
  r.last_node = nullptr;
}

void Scheduler::cache_unfinished(Req& r) {
  if (!cache_) return;
  const int aligned = cacheable_len(r) / runner_.page_size() * runner_.page_size();
  if (aligned <= r.prefix_len) return;
  const std::vector<int32_t> key = r.fill(aligned);
  const int64_t overlap = cache_->insert(key, std::span<const int32_t>(r.kv_slots.data(), static_cast<size_t>(aligned)));
  SPECULA_ASSERT(overlap >= r.prefix_len);
  if (overlap > r.prefix_len) {
    runner_.allocator().free(std::span<const int32_t>(r.kv_slots).subspan(r.prefix_len, overlap - r.prefix_len));
  }
  // From now on the request reads the cache's copy of those tokens and holds a lock on it.
  RadixCache::Match m = cache_->match_prefix(key);
  SPECULA_ASSERT(static_cast<int>(m.slots.size()) == aligned);
  std::copy(m.slots.begin(), m.slots.end(), r.kv_slots.begin());
  runner_.req_pool().write(r.req_pool_idx, 0, m.slots);
  cache_->inc_lock_ref(m.last_node);
  if (r.last_node != nullptr) cache_->dec_lock_ref(r.last_node);
  r.last_node = m.last_node;
  r.prefix_len = aligned;
}

void Scheduler::retract(Req& r) {
  const int kv = r.kv_len();
  release_kv(r);
  ++r.out.retractions;
  ++stats_.retractions;
  new_token_ratio_ = std::min(1.0, kInitNewTokenRatio * options_.schedule_conservativeness);
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

std::vector<Scheduler::Planned> Scheduler::schedule_decodes(int tokens) {
  const int page = runner_.page_size();
  auto is_decoding = [](const Req& r) { return r.pending() == 1; };
  // Free pages for every decoding request's next tokens: evict cached pages, then retract (the
  // request with the fewest output tokens first, then the longest prompt, as SGLang does).
  while (true) {
    int64_t need = 0;
    for (const auto& r : running_) {
      if (is_decoding(*r)) need += pages_for(r->kv_len() + tokens, page) - pages_for(r->kv_len(), page);
    }
    if (ensure_free_pages(need)) break;
    SPECULA_CHECK(running_.size() > 1, "the KV cache cannot hold one request's next token");
    auto victim = std::min_element(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
      if (a->out.output_ids.size() != b->out.output_ids.size()) return a->out.output_ids.size() < b->out.output_ids.size();
      return a->params.prompt_ids.size() > b->params.prompt_ids.size();
    });
    retract(**victim);
    waiting_.push_front(std::move(*victim));
    running_.erase(victim);
  }
  std::vector<Planned> plan;
  for (const auto& r : running_) {
    if (!is_decoding(*r)) continue;
    if (spec_ == nullptr) {
      SPECULA_ASSERT(alloc_decode(*r));
    } else {
      // Scratch slots for the cycle: mapped in the request's row but not (yet) its KV.
      const int kv = r->kv_len();
      const int32_t prefix[] = {kv}, seq[] = {kv + tokens}, last[] = {kv > 0 ? r->kv_slots.back() : -1};
      auto slots = runner_.allocator().alloc_extend(prefix, seq, last);
      SPECULA_ASSERT(slots.has_value());
      runner_.req_pool().write(r->req_pool_idx, kv, *slots);
      r->scratch = std::move(*slots);
    }
    plan.push_back({r.get(), 1});
  }
  return plan;
}

std::vector<Scheduler::Planned> Scheduler::schedule_prefills(int budget, int decodes) {
  std::vector<Planned> plan;
  const bool chunking = options_.chunked_prefill_size > 0;
  // Prompts already being prefilled in chunks go first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Req& r = *running_[i];
    if (r.pending() <= 1) continue;
    const int extend = chunking ? std::min(r.pending(), budget) : r.pending();
    if (!alloc_extend(r, extend)) {
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
  std::vector<const Req*> admitted;
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0;) {
    if (static_cast<int>(running_.size()) >= max_running) break;
    Req& r = **it;
    if (r.max_new_tokens == 0) {
      finish(r, "length");
      it = waiting_.erase(it);
      continue;
    }
    match_prefix(r);
    if (cache_ && r.fill_len() > r.prefix_len + kInBatchPrefixThreshold) {
      bool wait_for_cache = false;
      for (const Req* q : admitted) {
        int common = 0;
        const int n = std::min(r.fill_len(), q->fill_len());
        while (common < n && r.fill_id(common) == q->fill_id(common)) ++common;
        wait_for_cache = wait_for_cache || common >= r.prefix_len + kInBatchPrefixThreshold;
      }
      if (wait_for_cache) {
        if (r.last_node != nullptr) cache_->dec_lock_ref(r.last_node);
        r.kv_slots.clear();
        r.prefix_len = 0;
        r.last_node = nullptr;
        ++it;
        continue;
      }
    }
    const int extend = chunking ? std::min(r.pending(), budget) : r.pending();
    const int64_t page = runner_.page_size();
    const int64_t need = pages_for(r.pending(), static_cast<int>(page)) * page +
                         static_cast<int64_t>(std::min(r.remaining_new_tokens(), kReserveClipTokens) * new_token_ratio_);
    const int64_t room = runner_.allocator().available_size() + (cache_ ? cache_->evictable_size() : 0) - reserved;
    // The first request always fits an empty engine (the cache holds at least one full context).
    if ((need > room && !(running_.empty() && plan.empty() && decodes == 0))) {
      if (cache_ && r.last_node != nullptr) cache_->dec_lock_ref(r.last_node);
      r.kv_slots.clear();
      r.prefix_len = 0;
      r.last_node = nullptr;
      break;
    }
    r.req_pool_idx = runner_.req_pool().alloc(1).value().at(0);
    if (r.prefix_len > 0) runner_.req_pool().write(r.req_pool_idx, 0, r.kv_slots);
    if (!alloc_extend(r, extend)) {
      release_kv(r);
      break;
    }
    if (!r.admitted_once) {
      r.admitted_once = true;
      r.out.cached_tokens = r.prefix_len;
      stats_.cached_tokens += r.prefix_len;
      stats_.prompt_tokens += static_cast<int64_t>(r.params.prompt_ids.size());
    }
    reserved += need;
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
    plan = schedule_prefills(budget, 0);
    if (plan.empty()) {
      plan = schedule_decodes(spec_ != nullptr ? spec_->scratch_tokens() : 1);
      mode = ForwardMode::DECODE;
    }
  }
  if (!plan.empty() && mode == ForwardMode::DECODE && spec_ != nullptr) {
    run_spec_cycle(plan);
  } else if (!plan.empty()) {
    run_batch(plan, mode);
  } else if (running_.empty() && !waiting_.empty()) {
    // Not even an empty engine could take the next request (the KV cache is smaller than it
    // needs, or slots went missing): it ends with the reason instead of waiting forever.
    Req& r = *waiting_.front();
    finish(r, fmt::format("error: the KV cache ({} free tokens) cannot hold this request's {} tokens",
                          runner_.allocator().available_size(), r.fill_len()));
    waiting_.pop_front();
  }
  std::erase_if(running_, [](const auto& r) { return r->done; });
  ++stats_.steps;
  return true;
}

void Scheduler::run_batch(const std::vector<Planned>& plan, ForwardMode mode) {
  ForwardBatch b;
  b.forward_mode = mode;
  b.batch_size = static_cast<int>(plan.size());
  for (const Planned& p : plan) {
    const Req& r = *p.req;
    const int start = r.kv_len() - p.extend;  // slots were allocated already
    for (int i = start; i < r.kv_len(); ++i) {
      b.input_ids.push_back(r.fill_id(i));
      b.positions.push_back(i);
      b.out_cache_loc.push_back(r.kv_slots[static_cast<size_t>(i)]);
    }
    b.req_pool_indices.push_back(r.req_pool_idx);
    b.seq_lens.push_back(r.kv_len());
    if (mode != ForwardMode::DECODE) {
      b.extend_prefix_lens.push_back(start);
      b.extend_seq_lens.push_back(p.extend);
    }
    if (p.extend > 1 || r.out.output_ids.empty()) stats_.prefill_tokens += p.extend;
  }
  HiddenCapture capture;
  if (spec_ != nullptr) capture.layers = spec_->capture_layers();
  // Greedy requests without penalties need only each row's argmax: found where the logits are
  // (on a GPU, one id per row is downloaded instead of the vocabulary's logits).
  const bool argmax_only = std::all_of(plan.begin(), plan.end(), [](const Planned& p) {
    return p.req->sampler.picks_argmax() && p.req->params.logprobs < 0;
  });
  try {
    runner_.forward(b, logits_, /*all_tokens=*/false, spec_ != nullptr ? &capture : nullptr,
                    argmax_only ? &greedy_ids_ : nullptr);
  } catch (const std::exception& e) {
    // A failed step ends its requests with the reason rather than losing them silently; the KV
    // it was writing is not cached.
    for (const Planned& p : plan) finish(*p.req, std::string("error: ") + e.what(), /*cache_kv=*/false);
    return;
  }
  const auto vocab = static_cast<size_t>(runner_.config().vocab_size);
  for (size_t i = 0; i < plan.size(); ++i) {
    Req& r = *plan[i].req;
    try {
      if (r.pending() > 0) {
        if (spec_ == nullptr) cache_unfinished(r);
        continue;
      }
      const std::span<const float> row = argmax_only ? std::span<const float>()
                                                     : std::span<const float>(logits_).subspan(i * vocab, vocab);
      const int32_t token = argmax_only ? r.sampler.take_argmax(greedy_ids_[i]) : r.sampler.sample(row);
      if (r.params.logprobs >= 0) {
        auto [logprob, top] = log_softmax_at(row, token, r.params.logprobs);
        r.out.logprobs.push_back({logprob, std::move(top)});
      }
      if (plan[i].extend > 1 && spec_ == nullptr) cache_unfinished(r);
      process_token(r, token);
    } catch (const std::exception& e) {
      // E.g. logits that are all NaN: this request ends, the others go on.
      if (!r.done) finish(r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    }
  }
  if (spec_ != nullptr) draft_after_prefill(plan, capture);
  if (mode == ForwardMode::DECODE || mode == ForwardMode::MIXED) {
    const double init = std::min(1.0, kInitNewTokenRatio * options_.schedule_conservativeness);
    const double floor = init * kMinNewTokenRatioFactor;
    new_token_ratio_ = std::max(floor, new_token_ratio_ - (init - floor) / kNewTokenRatioDecaySteps);
  }
}

void Scheduler::draft_after_prefill(const std::vector<Planned>& plan, const HiddenCapture& capture) {
  // The draft pairs of each chunk: (token t + 1, target feature of t) for the chunk's positions t;
  // the token after the chunk is the next prompt token, or the one just sampled.
  const auto width = static_cast<size_t>(spec_->head().feature_size());
  std::vector<DraftExtendItem> items;
  std::vector<Req*> reqs;
  size_t row = 0;
  for (const Planned& p : plan) {
    Req& r = *p.req;
    const size_t first = row;
    row += static_cast<size_t>(p.extend);
    if (r.done) continue;
    const int start = r.kv_len() - p.extend;
    SPECULA_ASSERT(start == r.draft_len);
    DraftExtendItem it;
    it.req_pool_idx = r.req_pool_idx;
    it.start = start;
    for (int t = start; t < r.kv_len(); ++t) it.next_tokens.push_back(r.fill_id(t + 1));
    it.features = capture.data.data() + first * width;
    it.state = &r.draft;
    items.push_back(std::move(it));
    reqs.push_back(&r);
  }
  try {
    spec_->draft_extend(items);
  } catch (const std::exception& e) {
    for (Req* r : reqs) finish(*r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    return;
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    Req& r = *reqs[i];
    r.draft_len = r.kv_len();
    cache_unfinished(r);
  }
}

void Scheduler::run_spec_cycle(const std::vector<Planned>& plan) {
  std::vector<CycleItem> items(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    Req& r = *plan[i].req;
    items[i].req_pool_idx = r.req_pool_idx;
    items[i].kv_len = r.kv_len();
    items[i].root_token = r.fill_id(r.kv_len());
    items[i].state = &r.draft;
    items[i].sampler = &r.sampler;
  }
  try {
    spec_->run_cycle(items);
  } catch (const std::exception& e) {
    for (const Planned& p : plan) {
      Req& r = *p.req;
      free_after(r.scratch, r.kv_slots.empty() ? -1 : r.kv_slots.back());
      r.scratch.clear();
      finish(r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    }
    return;
  }
  std::vector<DraftExtendItem> extend;
  std::vector<Req*> extended;
  for (size_t i = 0; i < plan.size(); ++i) {
    Req& r = *plan[i].req;
    const VerifyResult& res = items[i].result;
    const auto accept_len = res.accepted_nodes.size();  // accepted draft tokens + the bonus token
    ++stats_.spec_cycles;
    stats_.spec_emitted_tokens += static_cast<int64_t>(accept_len);
    if (stats_.spec_accept_histogram.size() <= accept_len) stats_.spec_accept_histogram.resize(accept_len + 1, 0);
    ++stats_.spec_accept_histogram[accept_len];
    ++r.out.spec_verify_cycles;
    if (r.out.spec_accept_histogram.size() <= accept_len) r.out.spec_accept_histogram.resize(accept_len + 1, 0);
    ++r.out.spec_accept_histogram[accept_len];
    // The cycle's tokens: the accepted draft tokens, then the bonus. Emitting token j commits the
    // KV of the tree node before it (the root for j = 0), which now sits at scratch position j.
    std::vector<int32_t> emitted = res.accepted_tokens;
    emitted.push_back(res.bonus_token);
    const int kv0 = r.kv_len();
    std::vector<int32_t> scratch = std::move(r.scratch);
    r.scratch.clear();
    size_t used = 0;
    int32_t last_kept = r.kv_slots.empty() ? -1 : r.kv_slots.back();
    while (used < emitted.size() && !r.done) {
      r.kv_slots.push_back(scratch[used]);
      last_kept = scratch[used];
      process_token(r, emitted[used]);
      ++used;
    }
    free_after(std::span<const int32_t>(scratch).subspan(used), last_kept);
    if (r.done) continue;
    DraftExtendItem it;
    it.req_pool_idx = r.req_pool_idx;
    it.start = kv0;
    it.next_tokens = emitted;
    it.features = items[i].accepted_features.data();
    it.state = &r.draft;
    extend.push_back(std::move(it));
    extended.push_back(&r);
  }
  try {
    spec_->draft_extend(extend);
  } catch (const std::exception& e) {
    for (Req* r : extended) finish(*r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    return;
  }
  for (Req* r : extended) r->draft_len = r->kv_len();
}

void Scheduler::process_token(Req& r, int32_t token) {
  r.out.output_ids.push_back(token);
  const double t = std::chrono::duration<double>(Clock::now() - r.submitted).count();
  r.out.token_times_s.push_back(t);
  if (r.out.output_ids.size() == 1) r.out.time_to_first_token_s = t;
  ++stats_.decode_tokens;
  // A stop token ends the output without adding its text (as SGLang trims it).
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) return finish(r, "stop");
  if (r.text.push(token)) return finish(r, "stop");
  if (static_cast<int>(r.out.output_ids.size()) >= r.max_new_tokens) return finish(r, "length");
  publish(r, false);
}

void Scheduler::finish(Req& r, std::string reason, bool cache_kv) {
  if (r.text.finish() && reason == "length") reason = "stop";
  r.out.text = r.text.text();
  r.out.finish_reason = std::move(reason);
  r.out.latency_s = std::chrono::duration<double>(Clock::now() - r.submitted).count();
  release_kv(r, cache_kv);
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
  s.kv_free_tokens = runner_.allocator().available_size();
  s.kv_cached_tokens = cache_ ? cache_->total_size() : 0;
  s.kv_total_tokens = runner_.allocator().num_pages() * runner_.page_size();
  return s;
}

void Scheduler::flush_cache() {
  if (cache_) cache_->reset();
}

}  // namespace specula
