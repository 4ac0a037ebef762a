// EagleWorker against a fake target (FakeModel) and a fake draft head whose errors are designed,
// through the scheduler that drives it, so each case runs in milliseconds: the output must be the
// target's own greedy continuation whatever the draft proposes (lossless), every cycle must accept
// exactly what the head's construction says it should, and the draft extend must receive the
// target features of exactly the accepted tokens (the head checks each against the target's KV).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runtime/fake_model.h"
#include "specula/runtime/scheduler.h"
#include "specula/speculative/eagle_worker.h"
#include "speculative/fake_draft_head.h"

namespace specula {
namespace {

using testing_fixtures::FakeDraftHead;
using testing_fixtures::FakeModel;
using V = std::vector<int32_t>;

struct SpecCase {
  int num_steps, topk, num_draft_tokens, page_size, requests;
};

std::string case_name(const ::testing::TestParamInfo<SpecCase>& info) {
  const SpecCase& c = info.param;
  return "s" + std::to_string(c.num_steps) + "_k" + std::to_string(c.topk) + "_n" + std::to_string(c.num_draft_tokens) +
         "_page" + std::to_string(c.page_size) + "_bs" + std::to_string(c.requests);
}

// A FakeModel target, a FakeDraftHead for params, the worker and a scheduler driving it.
struct SpecHarness {
  SpecHarness(const SpecParams& params, int page_size, int max_context_len, int max_running_requests,
              int64_t kv_cache_tokens = 0, SpecPolicyKind policy = SpecPolicyKind::FIXED)
      : runner(std::make_unique<FakeModel>(), runner_options(params, page_size, max_context_len, max_running_requests,
                                                             kv_cache_tokens)),
        head(new FakeDraftHead(runner, params)),
        worker(runner, std::unique_ptr<DraftHead>(head), params, policy),
        scheduler(runner, nullptr, scheduler_options(), &worker) {}

  static ModelRunnerOptions runner_options(const SpecParams& params, int page_size, int max_context_len, int rows,
                                           int64_t kv_cache_tokens) {
    ModelRunnerOptions ro;
    ro.page_size = page_size;
    ro.max_context_len = max_context_len;
    ro.max_running_requests = rows;
    ro.kv_cache_tokens = kv_cache_tokens;
    ro.spec_scratch_tokens = params.scratch_tokens();
    return ro;
  }
  static SchedulerOptions scheduler_options() {
    SchedulerOptions so;
    so.log_retractions = false;
    return so;
  }

  ModelRunner runner;
  FakeDraftHead* head;  // owned by the worker
  EagleWorker worker;
  Scheduler scheduler;
};

class EagleWorkerFake : public ::testing::TestWithParam<SpecCase> {};

// Shapes the auto policy runs, forced in an order with every transition: runs of off cycles long
// enough that their pending pairs are flushed mid-run, then each drafting shape between off cycles.
void force_every_transition(EagleWorker& worker) {
  SpecPolicy& policy = worker.policy();
  std::vector<SpecShape> sequence(static_cast<size_t>(worker.params().num_draft_tokens) + 2, SpecShape{0, 1});
  for (const SpecShape& s : policy.shapes()) {
    if (s.off()) continue;
    sequence.insert(sequence.end(), {s, SpecShape{0, 1}, s, s});
  }
  policy.force_sequence(sequence);
}

void lossless_and_exact_accepts(const SpecCase& c, SpecPolicyKind policy) {
  SpecHarness h({c.num_steps, c.topk, c.num_draft_tokens}, c.page_size, 160, 8, 0, policy);
  if (policy == SpecPolicyKind::AUTO) force_every_transition(h.worker);
  FakeDraftHead& fake_head = *h.head;
  Scheduler& scheduler = h.scheduler;

  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("prompt seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, FakeModel::kVocab - 1);
  std::uniform_int_distribution<int> length(3, 40);
  std::map<uint64_t, V> prompts;
  std::map<uint64_t, int> budgets;
  std::map<uint64_t, RequestOutput> outputs;
  for (int i = 0; i < c.requests; ++i) {
    V prompt(static_cast<size_t>(length(rng)));
    for (int32_t& t : prompt) t = token(rng);
    EngineRequest r;
    r.prompt_ids = prompt;
    r.max_new_tokens = 20 + 7 * i;
    r.ignore_eos = true;
    scheduler.validate(r);
    const auto id = static_cast<uint64_t>(i);
    prompts[id] = prompt;
    budgets[id] = r.max_new_tokens;
    scheduler.submit(id, r, [&outputs](const StreamChunk& chunk) {
      if (chunk.finished) outputs[chunk.id] = *chunk.output;
    });
  }
  while (scheduler.step()) {
  }

  ASSERT_EQ(outputs.size(), prompts.size());
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(outputs[id].output_ids, FakeModel::continuation(prompt, budgets[id]))
        << "request " << id << " finished: " << outputs[id].finish_reason;
  }
  // Every cycle's accept length (accepted draft tokens + the bonus, as verified: a request's
  // output budget may keep fewer) is what the head's construction expected.
  const SchedulerStats stats = scheduler.stats();
  ASSERT_GT(stats.spec_cycles, 0);
  // Cycles with speculation off are plain decode steps: they draft nothing and count no accept
  // length.
  ASSERT_EQ(static_cast<int64_t>(fake_head.expected_accepts().size()), stats.spec_cycles);
  if (policy == SpecPolicyKind::AUTO) {
    int64_t off_steps = 0;
    for (const auto& [bucket, shapes] : stats.spec_choices) off_steps += shapes.count("off") ? shapes.at("off") : 0;
    EXPECT_GT(off_steps, 0);
  }
  std::vector<int64_t> expected_histogram(static_cast<size_t>(c.num_draft_tokens) + 1, 0);
  int64_t expected_emitted = 0;
  for (int accepted : fake_head.expected_accepts()) {
    ++expected_histogram[static_cast<size_t>(accepted) + 1];
    expected_emitted += accepted + 1;
  }
  std::vector<int64_t> histogram = stats.spec_accept_histogram;
  histogram.resize(expected_histogram.size(), 0);
  EXPECT_EQ(histogram, expected_histogram);
  EXPECT_EQ(stats.spec_emitted_tokens, expected_emitted);
}

TEST_P(EagleWorkerFake, LosslessAndAcceptsExactlyWhatTheDraftGotRight) {
  lossless_and_exact_accepts(GetParam(), SpecPolicyKind::FIXED);
}

// The same under the auto policy's shapes, forced through every transition: off cycles leave
// their pairs pending and the head (which checks that every draft starts from a current root and
// that pairs arrive in order) must still see each pair once, with the right feature.
TEST_P(EagleWorkerFake, EveryPolicyShapeSequenceIsLosslessAndKeepsTheDraftCurrent) {
  lossless_and_exact_accepts(GetParam(), SpecPolicyKind::AUTO);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EagleWorkerFake,
                         ::testing::Values(SpecCase{3, 1, 4, 1, 1}, SpecCase{5, 1, 6, 16, 3}, SpecCase{7, 1, 8, 4, 4},
                                           SpecCase{2, 2, 7, 1, 2}, SpecCase{3, 3, 22, 16, 3},
                                           SpecCase{4, 2, 15, 4, 4}),
                         case_name);

// The prefix cache and retraction under speculation: requests share a long prefix (the second and
// later ones start from the first one's cached pages, whose draft KV must exist too), and a KV
// cache too small for all of them at once forces retractions mid-run. Every output must still be
// the target's own, and every feature the head is given must match the target's KV.
TEST(EagleWorkerFake, PrefixCacheAndRetractionKeepEveryOutput) {
  const SpecParams params{3, 2, 7};
  // Room for about two requests' full contexts (plus scratch): six at once must retract.
  SpecHarness h(params, 4, 128, 6, 2 * (128 + params.scratch_tokens()));
  FakeDraftHead& fake_head = *h.head;
  Scheduler& scheduler = h.scheduler;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("prompt seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, FakeModel::kVocab - 1);
  V shared(37);
  for (int32_t& t : shared) t = token(rng);
  std::map<uint64_t, V> prompts;
  std::map<uint64_t, RequestOutput> outputs;
  auto submit = [&](uint64_t id, const V& prompt, int max_new_tokens) {
    EngineRequest r;
    r.prompt_ids = prompt;
    r.max_new_tokens = max_new_tokens;
    r.ignore_eos = true;
    scheduler.validate(r);
    prompts[id] = prompt;
    scheduler.submit(id, r, [&outputs](const StreamChunk& chunk) {
      if (chunk.finished) outputs[chunk.id] = *chunk.output;
    });
  };
  // The first request alone, so its prompt is cached before the others arrive.
  submit(0, shared, 30);
  while (scheduler.step()) {
  }
  for (uint64_t id = 1; id <= 6; ++id) {
    V prompt = shared;
    for (int i = 0; i < static_cast<int>(id); ++i) prompt.push_back(token(rng));
    submit(id, prompt, 60);
  }
  while (scheduler.step()) {
  }
  const SchedulerStats stats = scheduler.stats();
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(outputs[id].output_ids, FakeModel::continuation(prompt, id == 0 ? 30 : 60))
        << "request " << id << " finished: " << outputs[id].finish_reason;
  }
  // Each later request matches the shared 37 tokens' 9 whole pages: under speculation the cache
  // is keyed by bigrams, and the first 36 positions' bigrams are all shared.
  EXPECT_GE(stats.cached_tokens, 6 * 36) << "the later requests should start from the shared prefix's cached pages";
  EXPECT_GT(stats.retractions, 0) << "the KV cache should have been too small for every request at once";
  EXPECT_EQ(static_cast<int64_t>(fake_head.expected_accepts().size()), stats.spec_cycles);
}

// Requests whose prompts diverge inside a page, prefilled in the same batch: each caches its
// prompt, and the cache must not hand one request the other's draft pair at the position before
// the divergence (a pair holds the next token). Later requests extending either prompt start from
// the cache and must find their own pairs there too.
TEST(EagleWorkerFake, PromptsThatDivergeShareOnlyTheDraftPairsTheyAgreeOn) {
  for (const int page : {1, 4}) {
    SCOPED_TRACE("page size " + std::to_string(page));
    SpecHarness h({2, 2, 7}, page, 128, 8);
    Scheduler& scheduler = h.scheduler;
    const unsigned seed = std::random_device{}();
    SCOPED_TRACE("prompt seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> token(0, FakeModel::kVocab - 1);
    V shared(10);
    for (int32_t& t : shared) t = token(rng);
    // Prompts 0 and 1 agree on 10 tokens, then differ (within the third page of 4).
    V a = shared, b = shared;
    for (int i = 0; i < 9; ++i) {
      a.push_back(token(rng));
      b.push_back((a.back() + 1 + i) % FakeModel::kVocab);
    }
    std::map<uint64_t, V> prompts;
    std::map<uint64_t, RequestOutput> outputs;
    auto submit = [&](uint64_t id, const V& prompt) {
      EngineRequest r;
      r.prompt_ids = prompt;
      r.max_new_tokens = 12;
      r.ignore_eos = true;
      scheduler.validate(r);
      prompts[id] = prompt;
      scheduler.submit(id, r, [&outputs](const StreamChunk& chunk) {
        if (chunk.finished) outputs[chunk.id] = *chunk.output;
      });
    };
    submit(0, a);
    submit(1, b);
    while (scheduler.step()) {
    }
    V c = b, d = a;
    c.push_back(token(rng));
    d.push_back(token(rng));
    submit(2, c);
    submit(3, d);
    while (scheduler.step()) {
    }
    for (const auto& [id, prompt] : prompts) {
      EXPECT_EQ(outputs[id].output_ids, FakeModel::continuation(prompt, 12))
          << "request " << id << " finished: " << outputs[id].finish_reason;
    }
    // The later two start from the cached prompts they extend: the bigrams of positions 0..17 are
    // the cached ones (position 18's pairs the new token), in whole pages.
    EXPECT_GE(scheduler.stats().cached_tokens, 2 * (18 / page * page));
  }
}

// A head that proposes the target's continuation exactly: chains accept the whole tree every cycle
// (but the last of each request), so each request needs the fewest cycles possible.
TEST(EagleWorkerFake, ChainsOfAPerfectDraftTakeTheFewestCycles) {
  SpecHarness h({4, 1, 5}, 1, 128, 64);
  Scheduler& scheduler = h.scheduler;
  // kv_len % 5 == 4 puts the designed error past the chain's depth 4: with prompt 9 and a cycle
  // of 5 tokens, every cycle starts at kv_len = 9 + 5j, so the draft is always right.
  const V prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5};
  EngineRequest r;
  r.prompt_ids = prompt;
  r.max_new_tokens = 21;  // 1 from the prefill, then 4 cycles of 5
  r.ignore_eos = true;
  scheduler.validate(r);
  RequestOutput out;
  scheduler.submit(1, r, [&out](const StreamChunk& chunk) {
    if (chunk.finished) out = *chunk.output;
  });
  while (scheduler.step()) {
  }
  EXPECT_EQ(out.output_ids, FakeModel::continuation(prompt, 21));
  const SchedulerStats stats = scheduler.stats();
  EXPECT_EQ(stats.spec_cycles, 4);
  ASSERT_GE(stats.spec_accept_histogram.size(), 6u);
  EXPECT_EQ(stats.spec_accept_histogram[5], 4);
}

}  // namespace
}  // namespace specula
