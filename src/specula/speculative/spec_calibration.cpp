// Timing speculative cycles on stand-in requests (spec_calibration.h).
#include "specula/speculative/spec_calibration.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "specula/core/error.h"
#include "specula/runner/sampler.h"

namespace specula {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The stand-in requests: rows, slots, tokens and roots; given back on destruction.
struct StandIns {
  ModelRunner& target;
  int context_len;
  std::vector<int32_t> rows;
  std::vector<std::vector<int32_t>> slots, tokens;  // tokens: context_len + 1 (the root last)
  std::vector<DraftState> states;
  std::vector<float> features;  // the first request's pair features, reused for pending flushes

  StandIns(ModelRunner& t, int ctx) : target(t), context_len(ctx) {}
  ~StandIns() {
    for (const std::vector<int32_t>& s : slots) target.allocator().free(s);
    for (int32_t r : rows) target.req_pool().free(r);
  }
  StandIns(const StandIns&) = delete;
  StandIns& operator=(const StandIns&) = delete;
};

// How many stand-ins fit: free request rows and KV slots for the context plus a cycle's scratch.
int fitting_requests(ModelRunner& target, int context_len, int scratch, int wanted) {
  const int64_t per_request = (context_len + scratch + target.page_size() - 1) / target.page_size() * target.page_size();
  const int64_t by_kv = target.allocator().available_size() / per_request;
  return static_cast<int>(std::min<int64_t>({wanted, target.req_pool().available_size(), by_kv}));
}

// Fills request i's KV with an EXTEND forward over its context and gives it a root.
void prefill(EagleWorker& worker, StandIns& s, size_t i) {
  const int n = s.context_len;
  ForwardBatch b;
  b.forward_mode = ForwardMode::EXTEND;
  b.batch_size = 1;
  b.input_ids.assign(s.tokens[i].begin(), s.tokens[i].begin() + n);
  for (int p = 0; p < n; ++p) b.positions.push_back(p);
  b.out_cache_loc.assign(s.slots[i].begin(), s.slots[i].begin() + n);
  b.req_pool_indices = {s.rows[i]};
  b.seq_lens = {n};
  b.extend_prefix_lens = {0};
  b.extend_seq_lens = {n};
  HiddenCapture capture;
  capture.layers = worker.capture_layers();
  std::vector<float> logits;
  s.target.forward(b, logits, /*all_tokens=*/false, &capture);
  DraftExtendItem it;
  it.req_pool_idx = s.rows[i];
  it.start = 0;
  it.next_tokens.assign(s.tokens[i].begin() + 1, s.tokens[i].end());
  it.features = capture.data.data();
  it.state = &s.states[i];
  std::vector<DraftExtendItem> items{std::move(it)};
  worker.draft_extend(items);
  if (i == 0) s.features = std::move(capture.data);
}

// One drafting cycle of shape over the first bs stand-ins and its draft extend, as the scheduler
// runs it.
double time_cycle(EagleWorker& worker, StandIns& s, int bs, const SpecShape& shape) {
  std::vector<CycleItem> items(static_cast<size_t>(bs));
  for (size_t i = 0; i < items.size(); ++i) {
    items[i].req_pool_idx = s.rows[i];
    items[i].kv_len = s.context_len;
    items[i].root_token = s.tokens[i].back();
    items[i].state = &s.states[i];
  }
  const auto start = std::chrono::steady_clock::now();
  worker.run_cycle(items, shape);
  std::vector<DraftExtendItem> extend;
  for (size_t i = 0; i < items.size(); ++i) {
    DraftExtendItem it;
    it.req_pool_idx = s.rows[i];
    it.start = s.context_len;
    it.next_tokens = items[i].result.accepted_tokens;
    it.next_tokens.push_back(items[i].result.bonus_token);
    it.features = items[i].accepted_features.data();
    it.state = &s.states[i];
    extend.push_back(std::move(it));
  }
  worker.draft_extend(extend);
  return seconds_since(start);
}

double time_plain(StandIns& s, int bs) {
  ForwardBatch b;
  b.forward_mode = ForwardMode::DECODE;
  b.batch_size = bs;
  for (int i = 0; i < bs; ++i) {
    b.input_ids.push_back(s.tokens[static_cast<size_t>(i)].back());
    b.positions.push_back(s.context_len);
    b.out_cache_loc.push_back(s.slots[static_cast<size_t>(i)][static_cast<size_t>(s.context_len)]);
    b.req_pool_indices.push_back(s.rows[static_cast<size_t>(i)]);
    b.seq_lens.push_back(s.context_len + 1);
  }
  std::vector<float> logits;
  std::vector<int32_t> greedy;
  const auto start = std::chrono::steady_clock::now();
  s.target.forward(b, logits, /*all_tokens=*/false, nullptr, &greedy);
  return seconds_since(start);
}

// The largest shape's parts over the first bs stand-ins, each waited for (spec_calibration.h).
PhaseTime time_phases(EagleWorker& worker, StandIns& s, int bs) {
  using Clock = std::chrono::steady_clock;
  const SpecParams& P = worker.params();
  const int N = P.num_draft_tokens;
  PhaseTime out;
  out.batch_size = bs;
  std::vector<DraftRequest> requests;
  for (int i = 0; i < bs; ++i) requests.push_back({s.rows[static_cast<size_t>(i)], s.context_len, &s.states[static_cast<size_t>(i)]});
  std::vector<DraftCandidates> cands;
  auto t = Clock::now();
  worker.head().draft(requests, P.num_steps, cands);
  out.draft_s = seconds_since(t);

  ForwardBatch b;
  b.forward_mode = ForwardMode::TARGET_VERIFY;
  b.batch_size = bs;
  auto info = std::make_shared<SpecInfo>();
  info->num_draft_tokens = N;
  info->prefix_visible = true;
  for (int i = 0; i < bs; ++i) {
    const DraftTree tree = build_tree(s.tokens[static_cast<size_t>(i)].back(), cands[static_cast<size_t>(i)], N);
    const std::vector<int32_t> pos = tree_positions(tree, s.context_len);
    const std::vector<int32_t>& slots = s.slots[static_cast<size_t>(i)];
    b.input_ids.insert(b.input_ids.end(), tree.tokens.begin(), tree.tokens.end());
    b.positions.insert(b.positions.end(), pos.begin(), pos.end());
    b.out_cache_loc.insert(b.out_cache_loc.end(), slots.begin() + s.context_len, slots.begin() + s.context_len + N);
    b.req_pool_indices.push_back(s.rows[static_cast<size_t>(i)]);
    b.seq_lens.push_back(s.context_len);
    append_tree_mask_full(tree, s.context_len, info->custom_mask);
  }
  b.spec_info = info;
  HiddenCapture capture;
  capture.layers = worker.capture_layers();
  std::vector<float> logits;
  std::vector<int32_t> greedy;
  t = Clock::now();
  s.target.forward(b, logits, /*all_tokens=*/true, &capture, &greedy);
  out.verify_s = seconds_since(t);

  std::vector<DraftExtendItem> extend;
  for (int i = 0; i < bs; ++i) {
    DraftExtendItem it;
    it.req_pool_idx = s.rows[static_cast<size_t>(i)];
    it.start = s.context_len;
    it.next_tokens.assign(s.tokens[static_cast<size_t>(i)].begin(), s.tokens[static_cast<size_t>(i)].begin() + N);
    it.features = s.features.data();
    it.state = &s.states[static_cast<size_t>(i)];
    extend.push_back(std::move(it));
  }
  t = Clock::now();
  worker.draft_extend(extend);
  // The extend may only be queued: reading a root back waits for it.
  (void)worker.root_on_host(s.rows[0], s.states[0]);
  out.extend_s = seconds_since(t);
  return out;
}

}  // namespace

SpecTimings time_spec_cycles(EagleWorker& worker, ModelRunner& target, const SpecTimingOptions& options, bool details) {
  std::vector<int> sizes = options.batch_sizes;
  if (sizes.empty()) {
    for (int bs = 1; bs <= target.options().max_running_requests; ++bs) {
      if (worker.policy().costs().bucket(bs) == bs) sizes.push_back(bs);
    }
  }
  SPECULA_CHECK(options.repeats >= 1 && options.warmup >= 0, "timing repeats {} and warm-up {} must be >= 1 and >= 0",
                options.repeats, options.warmup);
  const int ctx = std::clamp(options.context_len, 2, target.max_context_len() - 1);
  if (sizes.empty()) return SpecTimings{};
  const int most = *std::max_element(sizes.begin(), sizes.end());
  const int fit = fitting_requests(target, ctx, worker.scratch_tokens(), most);
  std::erase_if(sizes, [&](int bs) { return bs < 1 || bs > fit; });
  std::sort(sizes.rbegin(), sizes.rend());
  SpecTimings out;
  out.context_len = ctx;
  if (sizes.empty()) return out;

  StandIns s(target, ctx);
  std::mt19937 rng(static_cast<uint32_t>(options.seed));
  std::uniform_int_distribution<int32_t> token(0, target.config().vocab_size - 1);
  const auto B = static_cast<size_t>(sizes.front());
  const std::vector<int32_t> rows = target.req_pool().alloc(static_cast<int>(B)).value();
  s.rows = rows;
  for (size_t i = 0; i < B; ++i) {
    const int page = target.page_size();
    const int tokens = (ctx + worker.scratch_tokens() + page - 1) / page * page;
    const std::optional<std::vector<int32_t>> slots = target.allocator().alloc(tokens);
    SPECULA_CHECK(slots.has_value(), "speculative timing: no KV slots for stand-in request {}", i);
    s.slots.push_back(*slots);
    target.req_pool().write(s.rows[i], 0, s.slots.back());
    std::vector<int32_t> ids(static_cast<size_t>(ctx) + 1);
    for (int32_t& t : ids) t = token(rng);
    s.tokens.push_back(std::move(ids));
  }
  s.states.resize(B);
  for (size_t i = 0; i < B; ++i) prefill(worker, s, i);

  for (int bs : sizes) {
    // The plain step: the policy's "off" (the catch-up when a request drafts again is left out:
    // it depends on how long it was off).
    std::vector<double> plain_t;
    for (int r = 0; r < options.warmup + options.repeats; ++r) {
      const double c = time_plain(s, bs);
      if (r >= options.warmup) plain_t.push_back(c);
    }
    const double plain_s = median(plain_t);
    for (const SpecShape& shape : worker.policy().shapes()) {
      if (shape.off()) {
        out.cycles.push_back({bs, shape, plain_s});
        continue;
      }
      std::vector<double> t;
      for (int r = 0; r < options.warmup + options.repeats; ++r) {
        const double c = time_cycle(worker, s, bs, shape);
        if (r >= options.warmup) t.push_back(c);
      }
      out.cycles.push_back({bs, shape, median(t)});
    }
    if (details) {
      out.plain.push_back({bs, plain_s});
      std::vector<double> v, d, e;
      for (int r = 0; r < options.warmup + options.repeats; ++r) {
        const PhaseTime p = time_phases(worker, s, bs);
        if (r < options.warmup) continue;
        v.push_back(p.verify_s);
        d.push_back(p.draft_s);
        e.push_back(p.extend_s);
      }
      out.phases.push_back({bs, median(v), median(d), median(e)});
    }
  }
  return out;
}

void calibrate_policy(EagleWorker& worker, ModelRunner& target, const SpecTimingOptions& options) {
  if (worker.policy().shapes().size() < 2) return;
  const SpecTimings t = time_spec_cycles(worker, target, options);
  for (const CycleTime& c : t.cycles) worker.policy().costs().set_prior(c.batch_size, c.shape, c.seconds);
}

}  // namespace specula
