// The scheduler's speculative glue (scheduler.h): one EagleWorker cycle over the decoding
// requests (their scratch slots allocated already), emitting each request's accepted run token by
// token under its stop conditions and keeping exactly the KV of the emitted tokens; and the draft
// head's extend after every prefill chunk, after which the chunk may join the prefix cache.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "specula/runtime/scheduled_request.h"
#include "specula/runtime/scheduler.h"

namespace specula {

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
    SPECULA_ASSERT(start == r.kv.draft_len, "chunk at {} but the draft KV ends at {}", start, r.kv.draft_len);
    DraftExtendItem it;
    it.req_pool_idx = r.kv.req_pool_idx;
    it.start = start;
    for (int t = start; t < r.kv_len(); ++t) it.next_tokens.push_back(r.fill_id(t + 1));
    it.features = capture.data.data() + first * width;
    it.state = &r.kv.draft;
    items.push_back(std::move(it));
    reqs.push_back(&r);
  }
  try {
    spec_->draft_extend(items);
  } catch (const std::exception& e) {
    for (Req* r : reqs) finish(*r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    return;
  }
  for (Req* r : reqs) {
    r->kv.draft_len = r->kv_len();
    kv_.cache_unfinished(r->kv, r->fill());
  }
}

void Scheduler::record_accept_length(Req& r, size_t accept_len) {
  ++stats_.spec_cycles;
  stats_.spec_emitted_tokens += static_cast<int64_t>(accept_len);
  if (stats_.spec_accept_histogram.size() <= accept_len) stats_.spec_accept_histogram.resize(accept_len + 1, 0);
  ++stats_.spec_accept_histogram[accept_len];
  ++r.out.spec_verify_cycles;
  if (r.out.spec_accept_histogram.size() <= accept_len) r.out.spec_accept_histogram.resize(accept_len + 1, 0);
  ++r.out.spec_accept_histogram[accept_len];
}

bool Scheduler::flush_pending_pairs(const std::vector<Planned>& plan) {
  std::vector<DraftExtendItem> items;
  std::vector<Req*> reqs;
  for (const Planned& p : plan) {
    Req& r = *p.req;
    if (r.done || r.kv.pending_tokens.empty()) continue;
    DraftExtendItem it;
    it.req_pool_idx = r.kv.req_pool_idx;
    it.start = r.kv.draft_len;
    it.next_tokens = r.kv.pending_tokens;
    it.features = r.kv.pending_features.data();
    it.state = &r.kv.draft;
    items.push_back(std::move(it));
    reqs.push_back(&r);
  }
  if (items.empty()) return true;
  try {
    spec_->draft_extend(items);
  } catch (const std::exception& e) {
    for (Req* r : reqs) {
      kv_.free_after(r->kv.scratch, r->kv.last_slot());
      r->kv.scratch.clear();
      finish(*r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    }
    return false;
  }
  for (Req* r : reqs) {
    r->kv.draft_len += static_cast<int>(r->kv.pending_tokens.size());
    r->kv.pending_tokens.clear();
    r->kv.pending_features.clear();
  }
  return true;
}

void Scheduler::run_spec_cycle(const std::vector<Planned>& plan) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  SpecPolicy& policy = spec_->policy();
  std::vector<const DepthAcceptance*> acceptance;
  for (const Planned& p : plan) acceptance.push_back(&p.req->acceptance);
  const SpecChoice choice = policy.choose(acceptance);
  const SpecShape shape = choice.shape;
  const int bs = static_cast<int>(plan.size());
  ++stats_.spec_choices[policy.costs().bucket(bs)][shape.str()];
  if (options_.log_spec_choices && !(shape == last_shape_)) {
    std::fprintf(stderr, "specula: speculative policy: batch %d runs %s: %s\n", bs, shape.str().c_str(), choice.why.c_str());
  }
  last_shape_ = shape;
  // The model work of the cycle, for the cost model: the per-token work below (emission, stop
  // checks, streaming) costs the same with and without speculation and is left out.
  double model_s = 0;
  if (!shape.off()) {
    // The draft must know every pair before it drafts from a request's root. (Not timed: this is
    // the deferred cost of the cycles that ran with speculation off.)
    if (!flush_pending_pairs(plan)) {
      for (const Planned& p : plan) {
        if (p.req->done) continue;
        kv_.free_after(p.req->kv.scratch, p.req->kv.last_slot());
        p.req->kv.scratch.clear();
      }
      return;
    }
  }
  std::vector<CycleItem> items(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    Req& r = *plan[i].req;
    items[i].req_pool_idx = r.kv.req_pool_idx;
    items[i].kv_len = r.kv_len();
    items[i].root_token = r.fill_id(r.kv_len());
    items[i].state = &r.kv.draft;
    items[i].sampler = &r.sampler;
    items[i].logprobs = r.params.logprobs;
  }
  auto t = Clock::now();
  try {
    spec_->run_cycle(items, shape);
  } catch (const std::exception& e) {
    for (const Planned& p : plan) {
      Req& r = *p.req;
      kv_.free_after(r.kv.scratch, r.kv.last_slot());
      r.kv.scratch.clear();
      finish(r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    }
    return;
  }
  model_s += since(t);
  std::vector<DraftExtendItem> extend;
  std::vector<Req*> extended;
  bool flush = false;
  for (size_t i = 0; i < plan.size(); ++i) {
    Req& r = *plan[i].req;
    const VerifyResult& res = items[i].result;
    if (!shape.off()) {
      // Accept lengths describe drafting cycles; an off cycle is a plain decode step.
      record_accept_length(r, res.accepted_nodes.size());  // accepted draft tokens + the bonus token
      const int depth = *std::max_element(items[i].tree.depths.begin(), items[i].tree.depths.end());
      const auto accepted = static_cast<int>(res.accepted_tokens.size());
      r.acceptance.observe(depth, accepted);
      policy.acceptance().observe(depth, accepted);
    }
    // The cycle's tokens: the accepted draft tokens, then the bonus. Emitting token j commits the
    // KV of the tree node before it (the root for j = 0), which now sits at scratch position j.
    std::vector<int32_t> emitted = res.accepted_tokens;
    emitted.push_back(res.bonus_token);
    const int kv0 = r.kv_len();
    std::vector<int32_t> scratch = std::move(r.kv.scratch);
    r.kv.scratch.clear();
    size_t used = 0;
    int32_t last_kept = r.kv.last_slot();
    while (used < emitted.size() && !r.done) {
      r.kv.slots.push_back(scratch[used]);
      last_kept = scratch[used];
      if (r.params.logprobs >= 0) r.out.logprobs.push_back(std::move(items[i].emitted_logprobs.at(used)));
      // The sampler's penalties count what was emitted, as sample() records it in plain decoding.
      r.sampler.record(emitted[used]);
      process_token(r, emitted[used]);
      ++used;
    }
    kv_.free_after(std::span<const int32_t>(scratch).subspan(used), last_kept);
    if (r.done) continue;
    if (shape.off()) {
      // The root's pair waits for a later extend, with the others of its request.
      r.kv.pending_tokens.push_back(emitted[0]);
      r.kv.pending_features.insert(r.kv.pending_features.end(), items[i].accepted_features.begin(),
                                   items[i].accepted_features.end());
      flush = flush || static_cast<int>(r.kv.pending_tokens.size()) >= spec_->params().num_draft_tokens;
      continue;
    }
    SPECULA_ASSERT(kv0 == r.kv.draft_len, "a cycle at {} but the draft KV ends at {}", kv0, r.kv.draft_len);
    DraftExtendItem it;
    it.req_pool_idx = r.kv.req_pool_idx;
    it.start = kv0;
    it.next_tokens = emitted;
    it.features = items[i].accepted_features.data();
    it.state = &r.kv.draft;
    extend.push_back(std::move(it));
    extended.push_back(&r);
  }
  t = Clock::now();
  if (flush) {
    // Pairs pile up while speculation is off: one extend for all of them every num_draft_tokens
    // cycles (the graphed extend's size) keeps the draft current at a small share of the cost.
    flush_pending_pairs(plan);
  }
  try {
    spec_->draft_extend(extend);
  } catch (const std::exception& e) {
    for (Req* r : extended) finish(*r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    return;
  }
  model_s += since(t);
  policy.observe(bs, shape, model_s);
  for (Req* r : extended) r->kv.draft_len = r->kv_len();
}

}  // namespace specula
