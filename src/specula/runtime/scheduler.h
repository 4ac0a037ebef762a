// Scheduler (SGLang's managers.Scheduler, single-threaded): continuous batching over one
// ModelRunner. Each step() it
//  - gives every decoding request one new KV slot; when the cache is full it evicts unused
//    prefix-cache pages and then retracts requests (KV freed, re-queued, recomputed later);
//  - admits waiting requests while the KV cache (free + evictable, minus what running requests
//    are expected to need) holds them, reusing cached prefix pages from the RadixCache;
//  - splits prompts longer than the step's token budget over several steps (chunked prefill);
//  - runs one forward: EXTEND (prefill only), DECODE, or MIXED (prefill chunks and decodes);
//  - samples, applies stop conditions, streams, and caches or frees the KV of finished requests.
// With an EagleWorker, decoding requests advance by speculative cycles instead of DECODE steps
// (draft, verify a tree, keep the accepted run), and every prefill chunk is followed by the draft
// head's extend over it; prefill and speculative steps are never mixed.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "specula/kv/radix_cache.h"
#include "specula/model/tokenizer.h"
#include "specula/runner/model_runner.h"
#include "specula/runtime/request.h"
#include "specula/speculative/eagle_worker.h"

namespace specula {

struct SchedulerOptions {
  int max_queued_requests = 4096;  // waiting requests beyond the running ones; more are refused
  // New prompt tokens per step (chunked prefill); 0: whole prompts, however long.
  int chunked_prefill_size = 4096;
  bool enable_mixed_chunk = true;   // run prefill chunks and decodes in one MIXED step
  bool disable_radix_cache = false;
  // Scales the KV reserved for the future tokens of running requests at admission (SGLang's
  // --schedule-conservativeness): lower admits more eagerly and retracts more often.
  double schedule_conservativeness = 1.0;
  bool log_retractions = true;  // one line on stderr per retraction
};

struct SchedulerStats {
  int running = 0;
  int waiting = 0;
  int64_t steps = 0;
  int64_t finished = 0;
  int64_t prefill_tokens = 0;   // prompt (and recomputed) tokens run through the model
  int64_t cached_tokens = 0;    // prompt tokens served from the prefix cache at admission
  int64_t prompt_tokens = 0;    // prompt tokens of admitted requests (first admission)
  int64_t decode_tokens = 0;    // tokens generated
  int64_t retractions = 0;
  int64_t spec_cycles = 0;           // speculative verify cycles
  int64_t spec_emitted_tokens = 0;   // sum of their accept lengths (accepted draft tokens + 1)
  std::vector<int64_t> spec_accept_histogram;  // [L] = cycles of accept length L
  int64_t kv_free_tokens = 0;   // free in the allocator
  int64_t kv_cached_tokens = 0; // held by the prefix cache
  int64_t kv_total_tokens = 0;
};

class Scheduler {
 public:
  // spec (optional, not owned): speculative decoding with this worker.
  Scheduler(ModelRunner& runner, const Tokenizer* tokenizer, const SchedulerOptions& options,
            EagleWorker* spec = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks the request (token ids in range, prompt shorter than the context, sampling and stop
  // parameters) and encodes a text prompt; throws specula::Error naming the bad value.
  // Thread-safe (reads only).
  void validate(EngineRequest& request) const;
  // Queues a validated request; throws specula::Error when max_queued_requests are waiting.
  // Times (first token, latency) count from `submitted`.
  void submit(uint64_t id, EngineRequest request, StreamCallback on_chunk,
              std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now());
  // Ends a request wherever it is (its KV is released); false if it is unknown or finished.
  bool cancel(uint64_t id);
  // Ends every request with this reason (shutdown, or a step that failed past recovery).
  void cancel_all(const std::string& reason);

  // One scheduling step and forward; false when there was nothing to run.
  bool step();
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  SchedulerStats stats() const;
  // Frees every prefix-cache page (only while no request holds any).
  void flush_cache();
  const RadixCache* radix_cache() const { return cache_.get(); }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Req;
  struct Planned {
    Req* req;
    int extend;  // tokens run this step
  };

  void match_prefix(Req& r);
  // Makes `pages` free pages available, evicting prefix-cache pages if needed.
  bool ensure_free_pages(int64_t pages);
  bool alloc_extend(Req& r, int extend);
  bool alloc_decode(Req& r);
  // Hands a request's KV to the prefix cache (page-aligned part) or frees it, and its row.
  // cache_kv = false frees the request's own slots without caching them (their contents are not
  // trustworthy after a failed step).
  void release_kv(Req& r, bool cache_kv = true);
  // After a prefill chunk: its page-aligned KV joins the prefix cache so others can share it.
  void cache_unfinished(Req& r);
  void retract(Req& r);
  // Frees pages for every decoding request's next `tokens` KV slots (evicting, then retracting)
  // and allocates them: one committed slot each, or with speculation scratch slots.
  std::vector<Planned> schedule_decodes(int tokens = 1);
  void run_spec_cycle(const std::vector<Planned>& plan);
  // After a prefill step: the draft head's extend over each chunk, then the chunk may be cached.
  void draft_after_prefill(const std::vector<Planned>& plan, const HiddenCapture& capture);
  // Frees the pages of `slots` (positions after a request's last kept slot `last_kept`) that do not
  // also hold kept tokens.
  void free_after(std::span<const int32_t> slots, int32_t last_kept);
  // KV tokens a request may hand to the prefix cache (with speculation, only those whose draft
  // KV was computed too).
  int cacheable_len(const Req& r) const;
  std::vector<Planned> schedule_prefills(int budget, int decodes);
  int64_t reserved_tokens() const;
  void run_batch(const std::vector<Planned>& plan, ForwardMode mode);
  void process_token(Req& r, int32_t token);
  void finish(Req& r, std::string reason, bool cache_kv = true);
  void publish(Req& r, bool finished);

  ModelRunner& runner_;
  const Tokenizer* tokenizer_;
  EagleWorker* spec_;
  SchedulerOptions options_;
  std::unique_ptr<RadixCache> cache_;
  std::deque<std::unique_ptr<Req>> waiting_;
  std::vector<std::unique_ptr<Req>> running_;
  double new_token_ratio_;
  SchedulerStats stats_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_ids_;  // a step's greedy tokens when every request picks the argmax
};

}  // namespace specula
