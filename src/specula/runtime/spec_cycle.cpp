// The scheduler's speculative glue (scheduler.h): the policy's shape for the step; one EagleWorker
// cycle over the decoding requests (their scratch slots allocated already), emitting each
// request's accepted run token by token under its stop conditions and keeping exactly the KV of
// the emitted tokens, or a plain step when drafting is off, and the draft's catch-up over what it
// missed meanwhile; and the draft head's extend after every prefill chunk, after which the chunk
// may join the prefix cache.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

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

bool Scheduler::run_spec_off_step(const std::vector<Planned>& plan) {
  for (const Planned& p : plan) {
    RequestKv& kv = p.req->kv;
    // The first scratch slot sits at the request's next position already (alloc_scratch).
    kv.slots.push_back(kv.scratch.front());
    kv_.free_after(std::span<const int32_t>(kv.scratch).subspan(1), kv.scratch.front());
    kv.scratch.clear();
  }
  return run_batch(plan, ForwardMode::DECODE);
}

std::string Scheduler::catch_up_drafts(const std::vector<Planned>& plan) {
  struct Lag {
    Req* req;
    int first;                    // the page-aligned position the borrowed pages start at
    std::vector<int32_t> pages;   // borrowed slots for positions [first, kv_len)
    std::vector<float> features;  // the recomputed features of positions [draft_len, kv_len)
  };
  std::vector<Lag> lags;
  const int page = kv_.page_size();
  int64_t need = 0;
  for (const Planned& p : plan) {
    Req& r = *p.req;
    if (r.done || r.kv.draft_len >= r.kv_len()) continue;
    const int first = r.kv.draft_len / page * page;
    need += (r.kv_len() - first + page - 1) / page;
    lags.push_back({&r, first, {}, {}});
  }
  if (lags.empty()) return {};
  if (!kv_.ensure_free_pages(need)) return fmt::format("no {} free KV pages to recompute the draft's missing pairs", need);
  // Whatever happens below, the rows map the requests' own KV again and the borrowed pages go
  // back.
  struct Borrowed {
    std::vector<Lag>& lags;
    ModelRunner& runner;
    void give_back() {
      for (Lag& l : lags) {
        if (l.pages.empty()) continue;
        const RequestKv& kv = l.req->kv;
        runner.req_pool().write(kv.req_pool_idx, l.first, std::span<const int32_t>(kv.slots).subspan(static_cast<size_t>(l.first)));
        runner.allocator().free(l.pages);
        l.pages.clear();
      }
    }
    ~Borrowed() { give_back(); }
  } borrowed{lags, runner_};
  try {
    std::vector<int32_t> src, dst;
    for (Lag& l : lags) {
      const RequestKv& kv = l.req->kv;
      const int len = l.req->kv_len();
      std::optional<std::vector<int32_t>> slots = runner_.allocator().alloc((len - l.first + page - 1) / page * page);
      SPECULA_CHECK(slots.has_value(), "{} free pages were made available but the allocator has fewer", need);
      l.pages = std::move(*slots);
      // The borrowed pages start with a copy of the KV before the lag on its first page, so that
      // the request's row can map whole pages to them while the EXTEND runs.
      for (int t = l.first; t < kv.draft_len; ++t) {
        src.push_back(kv.slots[static_cast<size_t>(t)]);
        dst.push_back(l.pages[static_cast<size_t>(t - l.first)]);
      }
      runner_.req_pool().write(kv.req_pool_idx, l.first,
                               std::span<const int32_t>(l.pages).first(static_cast<size_t>(len - l.first)));
    }
    runner_.copy_kv_slots(src, dst);
    // EXTENDs of at most the chunked-prefill size: a long lag runs as several chunks, each seeing
    // the ones before it in the borrowed pages.
    const int budget = options_.chunked_prefill_size > 0 ? options_.chunked_prefill_size : 4096;
    const auto width = static_cast<size_t>(spec_->head().feature_size());
    struct Segment {
      Lag* lag;
      int from, to;
    };
    std::vector<Segment> chunk;
    int in_chunk = 0;
    auto run_chunk = [&] {
      ForwardBatch b;
      b.forward_mode = ForwardMode::EXTEND;
      b.batch_size = static_cast<int>(chunk.size());
      for (const Segment& sg : chunk) {
        const Req& r = *sg.lag->req;
        for (int t = sg.from; t < sg.to; ++t) {
          b.input_ids.push_back(r.fill_id(t));
          b.positions.push_back(t);
          b.out_cache_loc.push_back(sg.lag->pages[static_cast<size_t>(t - sg.lag->first)]);
        }
        b.req_pool_indices.push_back(r.kv.req_pool_idx);
        b.seq_lens.push_back(sg.to);
        b.extend_prefix_lens.push_back(sg.from);
        b.extend_seq_lens.push_back(sg.to - sg.from);
      }
      HiddenCapture capture;
      capture.layers = spec_->capture_layers();
      runner_.forward(b, logits_, /*all_tokens=*/false, &capture);
      size_t row = 0;
      for (const Segment& sg : chunk) {
        const size_t n = static_cast<size_t>(sg.to - sg.from) * width;
        sg.lag->features.insert(sg.lag->features.end(), capture.data.begin() + static_cast<int64_t>(row),
                                capture.data.begin() + static_cast<int64_t>(row + n));
        row += n;
      }
      chunk.clear();
      in_chunk = 0;
    };
    for (Lag& l : lags) {
      for (int from = l.req->kv.draft_len; from < l.req->kv_len();) {
        const int to = std::min(l.req->kv_len(), from + (budget - in_chunk));
        chunk.push_back({&l, from, to});
        in_chunk += to - from;
        from = to;
        if (in_chunk >= budget) run_chunk();
      }
    }
    if (!chunk.empty()) run_chunk();
  } catch (const std::exception& e) {
    return std::string("recomputing the draft's missing pairs failed: ") + e.what();
  }
  // The draft extend writes the draft's KV through the rows: they must map the requests' own
  // slots again first.
  borrowed.give_back();
  std::vector<DraftExtendItem> items;
  for (Lag& l : lags) {
    Req& r = *l.req;
    DraftExtendItem it;
    it.req_pool_idx = r.kv.req_pool_idx;
    it.start = r.kv.draft_len;
    for (int t = it.start; t < r.kv_len(); ++t) it.next_tokens.push_back(r.fill_id(t + 1));
    it.features = l.features.data();
    it.state = &r.kv.draft;
    items.push_back(std::move(it));
  }
  try {
    spec_->draft_extend(items);
  } catch (const std::exception& e) {
    // The draft KV past draft_len is recomputed the next time; the target's KV is intact.
    return std::string("the draft extend over the missing pairs failed: ") + e.what();
  }
  for (Lag& l : lags) l.req->kv.draft_len = l.req->kv_len();
  return {};
}

void Scheduler::run_spec_cycle(const std::vector<Planned>& plan, std::chrono::steady_clock::time_point step_start) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  SpecPolicy& policy = spec_->policy();
  std::vector<const DepthAcceptance*> acceptance;
  for (const Planned& p : plan) acceptance.push_back(&p.req->acceptance);
  // Tokens the requests are ahead of their drafts (steps they ran with speculation off): per
  // request for the policy, in all for the catch-up's cost per token.
  int64_t missed = 0;
  std::vector<SpecLag> lags;
  for (const Planned& p : plan) {
    const int64_t lag = std::max(0, p.req->kv_len() - p.req->kv.draft_len);
    missed += lag;
    lags.push_back({lag, p.req->remaining_new_tokens()});
  }
  SpecChoice choice = policy.choose(acceptance, lags);
  // The draft must know every pair before it drafts from a request's root. (Left out of the
  // step's cost: this is the deferred cost of the steps that ran with speculation off, which the
  // policy learns apart, per missed token.) When it cannot, the step runs without drafting; the
  // requests' own KV is untouched either way.
  double catch_up_s = 0;
  if (!choice.shape.off()) {
    const auto t = Clock::now();
    std::string failed = catch_up_drafts(plan);
    catch_up_s = since(t);
    if (!failed.empty()) {
      choice = {SpecShape{}, 0, false, std::move(failed)};
    } else if (missed > 0) {
      policy.costs().observe_catch_up(static_cast<int>(plan.size()), missed, catch_up_s);
      ++stats_.spec_catch_ups;
      stats_.spec_catch_up_tokens += missed;
      stats_.spec_catch_up_s += catch_up_s;
    }
  }
  // What the policy learns: the step's whole time (planning, the scratch pages, building and
  // running the cycle, the draft extend), less the per-token work, which costs the same per token
  // with and without speculation, and the catch-up. The model work alone made short chains look
  // cheaper than they are where a cycle's fixed host work weighs (docs/PERFORMANCE.md, issue 50).
  const auto step_cost = [&] { return since(step_start) - emit_s_ - catch_up_s; };
  const SpecShape shape = choice.shape;
  const int bs = static_cast<int>(plan.size());
  ++stats_.spec_choices[policy.costs().bucket(bs)][shape.str()];
  if (options_.log_spec_choices && !(shape == last_shape_)) {
    std::fprintf(stderr, "specula: speculative policy: batch %d runs %s: %s\n", bs, shape.str().c_str(), choice.why.c_str());
  }
  // Costs are learnt from a shape's second cycle in a row on: the GPU work of a cycle is waited
  // for by the next one, so the first after a change carries the previous shape's tail.
  const bool steady = shape == last_shape_;
  last_shape_ = shape;
  if (shape.off()) {
    for (const Planned& p : plan) p.req->acceptance.drift_to(policy.acceptance());
    // A failed step (its requests ended with the error) says nothing of the shape's cost.
    if (run_spec_off_step(plan) && steady) policy.observe(bs, shape, step_cost());
    return;
  }
  std::vector<CycleItem> items;
  std::vector<Req*> reqs;
  for (const Planned& p : plan) {
    Req& r = *p.req;
    CycleItem it;
    it.req_pool_idx = r.kv.req_pool_idx;
    it.kv_len = r.kv_len();
    it.root_token = r.fill_id(r.kv_len());
    it.state = &r.kv.draft;
    it.sampler = &r.sampler;
    it.logprobs = r.params.logprobs;
    items.push_back(std::move(it));
    reqs.push_back(&r);
  }
  if (items.empty()) return;
  try {
    spec_->run_cycle(items, shape);
  } catch (const std::exception& e) {
    for (Req* r : reqs) {
      kv_.free_after(r->kv.scratch, r->kv.last_slot());
      r->kv.scratch.clear();
      finish(*r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    }
    return;
  }
  std::vector<DraftExtendItem> extend;
  std::vector<Req*> extended;
  for (size_t i = 0; i < items.size(); ++i) {
    Req& r = *reqs[i];
    if (!items[i].error.empty()) {
      kv_.free_after(r.kv.scratch, r.kv.last_slot());
      r.kv.scratch.clear();
      finish(r, "error: " + items[i].error, /*cache_kv=*/false);
      continue;
    }
    const VerifyResult& res = items[i].result;
    record_accept_length(r, res.accepted_nodes.size());  // accepted draft tokens + the bonus token
    const int depth = *std::max_element(items[i].tree.depths.begin(), items[i].tree.depths.end());
    const auto accepted = static_cast<int>(res.accepted_tokens.size());
    r.acceptance.observe(depth, accepted);
    policy.acceptance().observe(depth, accepted);
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
      // The sampler's penalties and grammar count what was emitted, as sample() records it in
      // plain decoding. The verify only accepts tokens the grammar allows; a violation here is a
      // bug, and ends this request with the reason rather than the step.
      try {
        r.sampler.record(emitted[used]);
      } catch (const std::exception& e) {
        finish(r, std::string("error: ") + e.what(), /*cache_kv=*/false);
        break;
      }
      r.kv.slots.push_back(scratch[used]);
      last_kept = scratch[used];
      if (r.params.logprobs >= 0) r.out.logprobs.push_back(std::move(items[i].emitted_logprobs.at(used)));
      process_token(r, emitted[used]);
      ++used;
    }
    kv_.free_after(std::span<const int32_t>(scratch).subspan(used), last_kept);
    if (r.done) continue;
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
  try {
    spec_->draft_extend(extend);
  } catch (const std::exception& e) {
    for (Req* r : extended) finish(*r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    return;
  }
  if (steady) policy.observe(bs, shape, step_cost());
  for (Req* r : extended) r->kv.draft_len = r->kv_len();
}

}  // namespace specula
