// The speculative policy through the Engine on the shipped pair (CPU): whatever shapes the policy
// runs, one after another ("off" cycles whose draft pairs wait for a later extend, chains cut
// short, the full tree), greedy output is token-for-token the output of plain decoding with the
// same cache settings, over topk 1/4, page sizes 1/16/64, bf16/fp8 KV, batch 1/8, with
// retraction forced by a tiny KV cache, chunked prefill and prefix-cache hits; sampled output
// keeps the target's distribution; every KV slot comes back.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine_fixtures.h"
#include "speculative/spec_fixtures.h"
#include "specula/runtime/engine.h"
#include "specula/speculative/spec_calibration.h"

namespace specula {
namespace {

using testing_fixtures::greedy;
using testing_fixtures::kModel;
using testing_fixtures::kTexts;
using spec_fixtures::head_dir;

constexpr int kMaxNew = 48;

struct AutoCase {
  int topk;
  int page_size;
  DType kv_dtype;
  int batch;
  bool tight_kv;  // a KV cache so small that requests are retracted
};

std::string case_name(const ::testing::TestParamInfo<AutoCase>& info) {
  const AutoCase& c = info.param;
  return "k" + std::to_string(c.topk) + "_page" + std::to_string(c.page_size) + "_" + std::string(dtype_name(c.kv_dtype)) +
         "_bs" + std::to_string(c.batch) + (c.tight_kv ? "_tight" : "");
}

EngineOptions options(const AutoCase& c) {
  EngineOptions o;
  o.background_thread = false;
  o.runner.page_size = c.page_size;
  o.runner.max_context_len = 256;
  o.runner.max_running_requests = c.batch;
  o.runner.kv_dtype = c.kv_dtype;
  if (c.tight_kv) o.runner.kv_cache_tokens = 640;
  o.scheduler.chunked_prefill_size = 48;
  o.scheduler.log_retractions = false;
  return o;
}

std::vector<std::string> texts() {
  // Shared prefixes: later requests read them from the prefix cache.
  std::vector<std::string> t;
  for (int i = 0; i < 10; ++i) t.push_back(kTexts[static_cast<size_t>(i) % kTexts.size()]);
  t.push_back(kTexts[8] + " " + kTexts[1]);
  return t;
}

std::vector<RequestOutput> run(Engine& engine, const std::vector<std::string>& prompts) {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const std::string& t : prompts) handles.push_back(engine.submit(greedy(t, kMaxNew)));
  engine.run_until_idle();
  std::vector<RequestOutput> outs;
  for (auto& h : handles) outs.push_back(h->wait());
  return outs;
}

class SpecAuto : public ::testing::TestWithParam<AutoCase> {};

TEST_P(SpecAuto, EveryShapeSequenceKeepsThePlainGreedyOutput) {
  const AutoCase c = GetParam();
  const std::vector<std::string> prompts = texts();
  std::vector<RequestOutput> plain;
  {
    Engine engine(kModel, options(c));
    plain = run(engine, prompts);
  }
  const SpecParams max = c.topk == 1 ? SpecParams{5, 1, 6} : SpecParams{4, 4, 10};
  EngineOptions o = options(c);
  o.speculative = EagleOptions{EagleKind::EAGLE3, head_dir(EagleKind::EAGLE3), max, SpecPolicyKind::AUTO};
  Engine engine(kModel, o);
  const int64_t free_at_start = engine.runner().allocator().available_size();
  SpecPolicy& policy = engine.speculative_worker()->policy();
  // Runs of off cycles long enough to flush pending pairs mid-run (every num_draft_tokens), then
  // every other shape, in an order with every kind of transition.
  std::vector<SpecShape> sequence;
  for (int i = 0; i < max.num_draft_tokens + 2; ++i) sequence.push_back({0, 1});
  for (const SpecShape& s : policy.shapes()) {
    if (s.off()) continue;
    sequence.push_back(s);
    sequence.push_back({0, 1});
    sequence.push_back(s);
  }
  policy.force_sequence(sequence);
  const std::vector<RequestOutput> outs = run(engine, prompts);
  int64_t cycles = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(outs[i].finish_reason, "length") << prompts[i];
    EXPECT_EQ(outs[i].output_ids, plain[i].output_ids) << prompts[i];
    cycles += outs[i].spec_verify_cycles;
  }
  const SchedulerStats s = engine.stats();
  EXPECT_GT(cycles, 0);
  if (c.tight_kv) {
    EXPECT_GT(s.retractions, 0);
  }
  // Pages of 64 are longer than the shared prefixes here: nothing to reuse.
  if (c.page_size <= 16) {
    EXPECT_GT(s.cached_tokens, 0);
  }
  // Both off cycles and drafting cycles ran.
  std::map<std::string, int64_t> by_shape;
  for (const auto& [bucket, shapes] : s.spec_choices) {
    for (const auto& [shape, n] : shapes) by_shape[shape] += n;
  }
  EXPECT_GT(by_shape["off"], 0);
  EXPECT_GT(by_shape.size(), 1u);
  engine.flush_cache();
  EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
}

std::vector<AutoCase> auto_cases() {
  std::vector<AutoCase> cases;
  for (int topk : {1, 4}) {
    for (int page : {1, 16, 64}) cases.push_back({topk, page, DType::f32, 8, false});
    cases.push_back({topk, 16, DType::fp8_e4m3, 8, false});
    cases.push_back({topk, 16, DType::bf16, 1, false});
    cases.push_back({topk, 16, DType::f32, 8, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Matrix, SpecAuto, ::testing::ValuesIn(auto_cases()), case_name);

// The policy left to its measurements: whatever it picks, the output is the plain output, and
// its choices are counted per batch size.
TEST(SpecAutoEngine, MeasuredChoicesKeepTheOutput) {
  const AutoCase c{1, 16, DType::f32, 4, false};
  const std::vector<std::string> prompts = texts();
  std::vector<RequestOutput> plain;
  {
    Engine engine(kModel, options(c));
    plain = run(engine, prompts);
  }
  EngineOptions o = options(c);
  o.speculative = EagleOptions{EagleKind::EAGLE3, head_dir(EagleKind::EAGLE3), SpecParams{7, 1, 8}, SpecPolicyKind::AUTO};
  Engine engine(kModel, o);
  const std::vector<RequestOutput> outs = run(engine, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(outs[i].output_ids, plain[i].output_ids) << prompts[i];
  const SchedulerStats s = engine.stats();
  int64_t total = 0;
  std::map<std::string, int64_t> by_shape;
  for (const auto& [bucket, shapes] : s.spec_choices) {
    EXPECT_GE(bucket, 1);
    EXPECT_LE(bucket, 4);
    for (const auto& [shape, n] : shapes) total += n, by_shape[shape] += n;
  }
  // Counted per step; spec_cycles counts a drafting cycle per request (off steps draft nothing),
  // so the drafting steps are at most spec_cycles and at least one.
  EXPECT_GT(total, 0);
  const int64_t drafting = total - (by_shape.count("off") ? by_shape.at("off") : 0);
  EXPECT_GT(drafting, 0);
  EXPECT_LE(drafting, s.spec_cycles);
  // Every shape of a batch size is measured once before the estimates decide: all 8 ran.
  EXPECT_EQ(by_shape.size(), 8u);
}

// The start-up calibration on stand-in requests: a time for every shape at every batch size that
// fits, plain steps too when asked, priors in the policy's cost model, and every request row and
// KV slot given back; requests served afterwards are untouched by it.
TEST(SpecAutoEngine, CalibrationTimesEveryShapeAndGivesEverythingBack) {
  const AutoCase c{1, 16, DType::f32, 4, false};
  EngineOptions o = options(c);
  o.speculative = EagleOptions{EagleKind::EAGLE3, head_dir(EagleKind::EAGLE3), SpecParams{3, 1, 4}, SpecPolicyKind::AUTO};
  Engine engine(kModel, o);
  ModelRunner& runner = engine.runner();
  const int64_t free_slots = runner.allocator().available_size();
  const int free_rows = runner.req_pool().available_size();
  EagleWorker& worker = *engine.speculative_worker();
  const SpecTimings t = time_spec_cycles(worker, runner, SpecTimingOptions{{1, 3}, 24, 1, 3, 7}, /*plain=*/true);
  EXPECT_EQ(t.context_len, 24);
  ASSERT_EQ(t.cycles.size(), 2 * worker.policy().shapes().size());
  ASSERT_EQ(t.plain.size(), 2u);
  for (const CycleTime& ct : t.cycles) {
    EXPECT_TRUE(ct.batch_size == 1 || ct.batch_size == 3);
    EXPECT_GT(ct.seconds, 0.0) << ct.shape.str();
  }
  EXPECT_EQ(runner.allocator().available_size(), free_slots);
  EXPECT_EQ(runner.req_pool().available_size(), free_rows);
  // A batch larger than the request rows is left out, not failed.
  const SpecTimings big = time_spec_cycles(worker, runner, SpecTimingOptions{{64}, 24, 0, 1, 7});
  EXPECT_TRUE(big.cycles.empty());
  calibrate_policy(worker, runner, SpecTimingOptions{{1, 2}, 24, 0, 1, 7});
  for (const SpecShape& s : worker.policy().shapes()) {
    EXPECT_TRUE(worker.policy().costs().seconds(2, s).has_value()) << s.str();
    EXPECT_EQ(worker.policy().costs().measured(2, s), 0) << s.str();
  }
  std::vector<RequestOutput> plain;
  {
    Engine reference(kModel, options(c));
    plain = run(reference, texts());
  }
  const std::vector<RequestOutput> outs = run(engine, texts());
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_EQ(outs[i].output_ids, plain[i].output_ids);
}

}  // namespace
}  // namespace specula
