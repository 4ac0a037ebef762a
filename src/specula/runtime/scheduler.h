// Scheduler (SGLang's managers.Scheduler, single-threaded): continuous batching over one
// ModelRunner. Each step() it
//  - gives every decoding request one new KV slot; when the cache is full it evicts unused
//    prefix-cache pages and then retracts requests (KV freed, re-queued, recomputed later);
//  - admits waiting requests while the KV cache (free + evictable, minus what running requests
//    are expected to need) holds them, reusing cached prefix pages from the RadixCache;
//  - splits prompts longer than the step's token budget over several steps (chunked prefill);
//  - runs one forward: EXTEND (prefill only), DECODE, or MIXED (prefill chunks and decodes);
//  - samples, applies stop conditions, streams, and caches or frees the KV of finished requests.
// With an EagleWorker, decoding requests advance by speculative cycles (draft, verify a tree, keep
// the accepted run) of the shape its policy picks per step, or by plain DECODE steps where the
// policy turns drafting off; every prefill chunk is followed by the draft head's extend over it;
// prefill and speculative steps are never mixed.
//
// The implementation is split by concept: scheduler.cpp (the policy: admission, retraction,
// step), request_kv.h (the per-request KV ledger), batch_assembly.cpp (a plan's ForwardBatch,
// the forward and sampling) and spec_cycle.cpp (the speculative glue).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "specula/grammar/mask_warmer.h"
#include "specula/grammar/token_masker.h"
#include "specula/kv/radix_cache.h"
#include "specula/model/tokenizer.h"
#include "specula/runner/model_runner.h"
#include "specula/runtime/admission_groups.h"
#include "specula/runtime/request.h"
#include "specula/runtime/request_kv.h"
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
  // One line on stderr each time the speculative policy changes the draft shape, with why.
  bool log_spec_choices = false;
  // Structured output: each new grammar's mask keys are classified in the background for up to
  // this long (one thread; grammar/mask_warmer.h), so its first requests' steps find most masks
  // cached; 0: only on first use.
  double grammar_warm_up_s = 0.1;
  // The Engine builds the tokenizer's grammar vocabulary (every token's bytes and their trie:
  // 0.1-0.2 s for a 128k vocabulary) on a background thread while the model loads, so that the
  // first constrained request does not wait for it (as xgrammar's tokenizer info is made at
  // start-up); false: at the first constrained request.
  bool prepare_grammar_vocabulary = true;
  // While speculating, waiting requests are admitted in groups once this many rows are free
  // (runtime/admission_groups.h): 0 sizes the groups from measured step times; 1 admits as rows
  // free.
  int speculative_admission_group = 0;
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
  // Steps that ran prompts alone (EXTEND: no decode rows in them) and their wall time. With
  // speculation on every prefill is such a step (a cycle is a step of its own).
  int64_t prefill_only_steps = 0;
  double prefill_only_s = 0;
  // Of prefill_only_s: the model's forward (with sampling's device part) and, under speculation,
  // the draft head's extend over the prompts; the rest is the step's host work.
  double prefill_only_forward_s = 0;
  double prefill_only_draft_extend_s = 0;
  // Steps that ran without admitting while rows were free, waiting for a group (speculation).
  int64_t admission_deferred_steps = 0;
  // The admission groups' estimates now (runtime/admission_groups.h): the group size last asked
  // for, a prefill step's fixed part, a decode step's seconds and the rows freed per decode step.
  int admission_group = 0;
  double admission_fixed_s = 0;
  double admission_cycle_s = 0;
  double admission_rows_freed_per_cycle = 0;
  int64_t spec_cycles = 0;           // speculative verify cycles that drafted (per request)
  int64_t spec_emitted_tokens = 0;   // sum of their accept lengths (accepted draft tokens + 1)
  std::vector<int64_t> spec_accept_histogram;  // [L] = cycles of accept length L
  // The speculative policy's choices: cycles per (batch size bucket, shape: "off" or
  // "(steps, draft tokens)").
  std::map<int, std::map<std::string, int64_t>> spec_choices;
  // Catch-ups of the draft after steps with speculation off: how many, their missed tokens (all
  // requests) and seconds.
  int64_t spec_catch_ups = 0;
  int64_t spec_catch_up_tokens = 0;
  double spec_catch_up_s = 0;
  int64_t kv_free_tokens = 0;   // free in the allocator
  int64_t kv_cached_tokens = 0; // held by the prefix cache
  int64_t kv_total_tokens = 0;
};

class Scheduler {
 public:
  // spec (optional, not owned): speculative decoding with this worker. vocabulary (optional):
  // the tokenizer's grammar vocabulary being built (the first constrained request waits for it);
  // without it, that request builds it.
  Scheduler(ModelRunner& runner, const Tokenizer* tokenizer, const SchedulerOptions& options,
            EagleWorker* spec = nullptr,
            std::future<std::shared_ptr<const grammar::Vocabulary>> vocabulary = {});
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
  const RadixCache* radix_cache() const { return kv_.cache(); }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Req;  // scheduled_request.h
  struct Planned {
    Req* req;
    int extend;  // tokens run this step
  };

  // Policy (scheduler.cpp).
  // Frees pages for every decoding request's next `tokens` KV slots (evicting, then retracting)
  // and allocates them: one committed slot each, or with speculation scratch slots.
  std::vector<Planned> schedule_decodes(int tokens = 1);
  // Continues chunked prefills, then admits waiting requests while the KV cache holds them.
  std::vector<Planned> schedule_prefills(int budget, int decodes);
  // Whether r should wait a step for a prefix that a request admitted this step will cache.
  bool waits_for_in_batch_prefix(const Req& r, const std::vector<const Req*>& admitted) const;
  // Whether, while speculating, this step leaves free rows empty to admit a group later.
  bool defer_admission();
  // KV tokens the running requests are expected to need still.
  int64_t reserved_tokens() const;
  // The running request a full KV cache pushes back out.
  std::vector<std::unique_ptr<Req>>::iterator retraction_victim();
  void retract(Req& r);
  double initial_new_token_ratio() const;
  void process_token(Req& r, int32_t token);
  void finish(Req& r, std::string reason, bool cache_kv = true);
  void publish(Req& r, bool finished);

  // Batch assembly (batch_assembly.cpp): the ForwardBatch of a plan whose KV slots are
  // allocated, and one forward over it with sampling; false when the forward failed (its
  // requests then ended with the error).
  // Under speculation a DECODE step is one the policy ran with speculation off: a plain step, no
  // features captured (catch_up_drafts recomputes them when the request speculates again).
  ForwardBatch assemble_batch(const std::vector<Planned>& plan, ForwardMode mode);
  bool run_batch(const std::vector<Planned>& plan, ForwardMode mode);

  // Speculative glue (spec_cycle.cpp): one cycle over the decoding requests, and the draft head's
  // extend over each prefill chunk, after which the chunk may be cached.
  // step_start: when step() began; the policy learns the step's whole time from it, less the
  // per-token work (emit_s_) and the draft's catch-up.
  void run_spec_cycle(const std::vector<Planned>& plan, std::chrono::steady_clock::time_point step_start);
  void draft_after_prefill(const std::vector<Planned>& plan, const HiddenCapture& capture);
  void record_accept_length(Req& r, size_t accept_len);
  // A step with speculation off: each request's first scratch slot becomes its decode slot, the
  // rest goes back, and the step runs as plain decoding. False when its forward failed.
  bool run_spec_off_step(const std::vector<Planned>& plan);
  // Requests that decoded with speculation off hold KV the draft never saw. One EXTEND of the
  // target over those tokens recomputes their features, its K/V written to borrowed pages (the
  // requests' own KV untouched: the output stays that of plain decoding), and the draft extends
  // over the pairs. Returns why it could not (no pages to borrow, a failed forward or extend:
  // the step then runs with speculation off and nothing else changed), or empty.
  std::string catch_up_drafts(const std::vector<Planned>& plan);

  ModelRunner& runner_;
  const Tokenizer* tokenizer_;
  // The tokenizer's token bytes for grammar masks (vocabulary()), and the maskers of the grammars
  // seen lately (requests of one grammar share its cached masks).
  std::shared_ptr<const grammar::Vocabulary> vocabulary_;
  // The vocabulary being built on a background thread (prepare_grammar_vocabulary).
  std::future<std::shared_ptr<const grammar::Vocabulary>> vocabulary_build_;
  const std::shared_ptr<const grammar::Vocabulary>& vocabulary();
  std::list<std::pair<std::string, std::shared_ptr<grammar::TokenMasker>>> maskers_;
  // A masker holds a vocabulary bitmask per cached frame sequence (16 KiB each for 128k tokens:
  // about 3 MB per schema on first use, about 11 MB once warmed up), so only the grammars of
  // recent requests keep theirs.
  static constexpr size_t kMaxMaskers = 16;
  std::shared_ptr<grammar::TokenMasker> masker_for(const grammar::OutputFormat& format);
  std::unique_ptr<grammar::MaskWarmer> warmer_;  // made with the first grammar (warm-up on)
  EagleWorker* spec_;
  SchedulerOptions options_;
  KvLedger kv_;
  std::deque<std::unique_ptr<Req>> waiting_;
  std::vector<std::unique_ptr<Req>> running_;
  double new_token_ratio_;
  AdmissionGroups admission_groups_;
  // The last admission stopped for KV room rather than rows (groups then are not waited for).
  bool admission_kv_limited_ = false;
  SchedulerStats stats_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_ids_;  // a step's greedy tokens when every request picks the argmax
  // A step's rows drawn at temperature > 0 (draw_rows): the token, or -1 and why not.
  struct Drawn {
    int32_t token = -1;
    std::string error;
  };
  std::vector<Drawn> drawn_;
  void draw_rows(const std::vector<Planned>& plan, bool argmax_only, size_t vocab);
  // This step's seconds in process_token (the per-token work: emission, stop checks, streaming).
  double emit_s_ = 0;
  // The last run_batch's seconds in the model's forward and in the draft's extend after it.
  double batch_forward_s_ = 0;
  double batch_draft_extend_s_ = 0;
  SpecShape last_shape_{-1, -1};     // the speculative policy's previous choice (for the log)
};

}  // namespace specula
