// Speculative decoding through the Engine on the shipped model pair (CPU): greedy output must be
// token-for-token the target's own greedy output for every head, tree shape, page size and batch
// size, with chunked prefill and prefix-cache hits; every KV slot returns after cancellations; and
// sampled output must follow the target's distribution.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "runtime/engine_fixtures.h"
#include "specula/core/error.h"
#include "specula/runtime/engine.h"

namespace specula {
namespace {

using testing_fixtures::greedy;
using testing_fixtures::kModel;
using testing_fixtures::kTexts;

const std::filesystem::path kRoot = SPECULA_SOURCE_DIR;
constexpr int kMaxNew = 40;

EngineOptions options(int page_size, int max_running = 16, int chunk = 4096, bool radix = true) {
  EngineOptions o;
  o.background_thread = false;
  o.runner.page_size = page_size;
  o.runner.max_context_len = 320;
  o.runner.max_running_requests = max_running;
  o.scheduler.chunked_prefill_size = chunk;
  o.scheduler.disable_radix_cache = !radix;
  o.scheduler.log_retractions = false;
  return o;
}

EagleOptions eagle(EagleKind kind, SpecParams p) {
  return EagleOptions{kind,
                      kRoot / (kind == EagleKind::EAGLE ? "models/specula-byte-6m-eagle" : "models/specula-byte-6m-eagle3"),
                      p};
}

// The target's greedy output without speculation, one request at a time.
const std::vector<int32_t>& plain(const std::string& text) {
  static std::map<std::string, std::vector<int32_t>> memo;
  auto it = memo.find(text);
  if (it != memo.end()) return it->second;
  EngineOptions o = options(16, 1);
  Engine engine(kModel, o);
  auto h = engine.submit(greedy(text, kMaxNew));
  engine.run_until_idle();
  return memo.emplace(text, h->wait().output_ids).first->second;
}

struct Case {
  EagleKind kind;
  SpecParams params;
  int page_size;
  int batch;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(eagle_kind_name(c.kind)) + "_s" + std::to_string(c.params.num_steps) + "_k" +
         std::to_string(c.params.topk) + "_n" + std::to_string(c.params.num_draft_tokens) + "_page" +
         std::to_string(c.page_size) + "_bs" + std::to_string(c.batch);
}

class SpecGreedy : public ::testing::TestWithParam<Case> {};

TEST_P(SpecGreedy, OutputEqualsTheTargetsGreedyOutput) {
  const Case c = GetParam();
  EngineOptions o = options(c.page_size, c.batch);
  o.speculative = eagle(c.kind, c.params);
  Engine engine(kModel, o);
  const int64_t free_at_start = engine.runner().allocator().available_size();
  std::vector<std::shared_ptr<RequestHandle>> handles;
  std::vector<std::string> texts;
  // More requests than the batch holds: later ones join as earlier ones finish.
  for (int i = 0; i < std::max(c.batch, 4); ++i) texts.push_back(kTexts[static_cast<size_t>(i) % kTexts.size()]);
  for (const std::string& t : texts) handles.push_back(engine.submit(greedy(t, kMaxNew)));
  engine.run_until_idle();
  for (size_t i = 0; i < texts.size(); ++i) {
    const RequestOutput out = handles[i]->wait();
    EXPECT_EQ(out.finish_reason, "length") << texts[i];
    EXPECT_EQ(out.output_ids, plain(texts[i])) << texts[i];
    EXPECT_GT(out.spec_verify_cycles, 0);
    int cycles = 0;
    for (int n : out.spec_accept_histogram) cycles += n;
    EXPECT_EQ(cycles, out.spec_verify_cycles);
  }
  const SchedulerStats s = engine.stats();
  EXPECT_GT(s.spec_cycles, 0);
  // The first token comes from the prefill; each cycle produced its accept length.
  EXPECT_GE(s.spec_emitted_tokens + static_cast<int64_t>(texts.size()), s.decode_tokens);
  engine.flush_cache();
  EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
}

std::vector<Case> greedy_cases() {
  std::vector<Case> cases;
  for (EagleKind kind : {EagleKind::EAGLE, EagleKind::EAGLE3}) {
    for (SpecParams p : {SpecParams{1, 1, 2}, SpecParams{3, 1, 4}, SpecParams{3, 4, 8}, SpecParams{6, 8, 32}}) {
      for (int page : {1, 16}) cases.push_back({kind, p, page, 4});
    }
  }
  for (int batch : {1, 16}) cases.push_back({EagleKind::EAGLE3, SpecParams{6, 4, 16}, 16, batch});
  cases.push_back({EagleKind::EAGLE3, SpecParams{3, 8, 12}, 1, 8});
  cases.push_back({EagleKind::EAGLE, SpecParams{6, 1, 7}, 16, 8});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, SpecGreedy, ::testing::ValuesIn(greedy_cases()), case_name);

TEST(SpecEngine, ChunkedPrefillAndPrefixCacheHitsKeepTheOutput) {
  EngineOptions o = options(16, 8, /*chunk=*/24);
  o.speculative = eagle(EagleKind::EAGLE3, SpecParams{5, 4, 8});
  Engine engine(kModel, o);
  // The same long prompts twice: the second round reads their prefixes from the cache.
  const std::string shared = kTexts[8] + " " + kTexts[1];
  const std::vector<std::string> texts = {shared, shared + " And then", kTexts[8], kTexts[3]};
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const std::string& t : texts) handles.push_back(engine.submit(greedy(t, kMaxNew)));
    engine.run_until_idle();
    for (size_t i = 0; i < texts.size(); ++i) {
      const RequestOutput out = handles[i]->wait();
      EXPECT_EQ(out.output_ids, plain(texts[i])) << "round " << round << ": " << texts[i];
      if (round == 1) EXPECT_GT(out.cached_tokens, 0) << texts[i];
    }
  }
}

TEST(SpecEngine, MeanAcceptLengthOfTheShippedHeadsIsWellAboveOne) {
  for (EagleKind kind : {EagleKind::EAGLE, EagleKind::EAGLE3}) {
    EngineOptions o = options(16);
    o.speculative = eagle(kind, SpecParams{5, 4, 8});
    Engine engine(kModel, o);
    for (const std::string& t : kTexts) engine.submit(greedy(t, kMaxNew));
    engine.run_until_idle();
    const SchedulerStats s = engine.stats();
    const double mean = static_cast<double>(s.spec_emitted_tokens) / static_cast<double>(s.spec_cycles);
    // The reference reports 2.68 (EAGLE) and 4.12 (EAGLE-3) on validation text at (5, 4, 8).
    EXPECT_GT(mean, kind == EagleKind::EAGLE ? 1.8 : 2.5) << eagle_kind_name(kind);
    EXPECT_LE(mean, 8.0);
  }
}

TEST(SpecEngine, EveryKvSlotReturnsAfterALongRunWithCancellations) {
  EngineOptions o = options(16, 6, 32);
  o.runner.kv_cache_tokens = 1024;  // tight: retractions happen
  o.speculative = eagle(EagleKind::EAGLE3, SpecParams{4, 4, 10});
  Engine engine(kModel, o);
  const int64_t free_at_start = engine.runner().allocator().available_size();
  std::mt19937 rng(std::random_device{}());
  std::vector<std::pair<std::string, std::shared_ptr<RequestHandle>>> handles;
  for (int i = 0; i < 40; ++i) {
    const std::string& t = kTexts[rng() % kTexts.size()];
    handles.emplace_back(t, engine.submit(greedy(t, 8 + static_cast<int>(rng() % (kMaxNew - 7)))));
    for (int s = 0; s < static_cast<int>(rng() % 3); ++s) engine.step();
    if (rng() % 4 == 0) engine.cancel(handles[rng() % handles.size()].second->id());
  }
  engine.run_until_idle();
  for (auto& [text, h] : handles) {
    const RequestOutput out = h->wait();
    ASSERT_TRUE(out.finish_reason == "length" || out.finish_reason == "cancelled") << out.finish_reason;
    if (out.finish_reason == "length") {
      const std::vector<int32_t>& full = plain(text);
      ASSERT_LE(out.output_ids.size(), full.size());
      EXPECT_TRUE(std::equal(out.output_ids.begin(), out.output_ids.end(), full.begin())) << text;
    }
  }
  engine.flush_cache();
  EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
}

TEST(SpecEngine, StopTokensInsideAnAcceptedRunEndTheOutputThere) {
  EngineOptions o = options(16);
  o.speculative = eagle(EagleKind::EAGLE3, SpecParams{6, 4, 16});
  Engine engine(kModel, o);
  const std::vector<int32_t>& full = plain(kTexts[0]);
  // Stop at the 5th token's id: the output ends at its first occurrence, wherever the cycle was.
  EngineRequest r = greedy(kTexts[0], kMaxNew);
  r.stop_token_ids = {full[4]};
  auto h = engine.submit(r);
  engine.run_until_idle();
  const RequestOutput out = h->wait();
  const auto first = std::find(full.begin(), full.end(), full[4]);
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_EQ(out.output_ids, std::vector<int32_t>(full.begin(), first + 1));
}

TEST(SpecEngine, PenaltiesAreRefusedWithSpeculation) {
  EngineOptions o = options(16);
  o.speculative = eagle(EagleKind::EAGLE, SpecParams{3, 1, 4});
  Engine engine(kModel, o);
  EngineRequest r = greedy(kTexts[0]);
  r.sampling.repetition_penalty = 1.2f;
  EXPECT_THROW(engine.submit(r), Error);
}

}  // namespace
}  // namespace specula
