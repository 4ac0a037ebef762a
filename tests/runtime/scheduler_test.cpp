// The scheduler's decisions (admission, chunked prefill, mixed steps, prefix reuse, eviction and
// retraction, the queue limit, cancellation) against FakeModel, so each runs in milliseconds. The
// expected batches follow from the rules in scheduler.cpp worked through by hand (the comments
// show the arithmetic); every output must equal FakeModel::continuation, which holds only if the
// KV each step read was the right one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/fake_model.h"
#include "specula/core/error.h"
#include "specula/grammar/output_format.h"
#include "specula/model/tokenizer.h"
#include "specula/runner/sampler.h"
#include "specula/runtime/scheduler.h"

namespace specula {
namespace {

using testing_fixtures::FakeModel;
using testing_fixtures::RecordedBatch;
using V = std::vector<int32_t>;

SchedulerOptions scheduler_options(int chunk, bool mixed, bool radix = true) {
  SchedulerOptions o;
  o.chunked_prefill_size = chunk;
  o.enable_mixed_chunk = mixed;
  o.disable_radix_cache = !radix;
  o.log_retractions = false;
  return o;
}

// A runner over a FakeModel, a scheduler, and every request's final output.
struct Harness {
  Harness(int page_size, int max_context_len, int64_t kv_cache_tokens, const SchedulerOptions& options,
          int max_running_requests = 64)
      : runner(std::make_unique<FakeModel>(), runner_options(page_size, max_context_len, kv_cache_tokens,
                                                             max_running_requests)),
        model(static_cast<FakeModel&>(runner.model())),
        scheduler(runner, nullptr, options) {}

  static ModelRunnerOptions runner_options(int page_size, int max_context_len, int64_t kv_cache_tokens, int rows) {
    ModelRunnerOptions o;
    o.page_size = page_size;
    o.max_context_len = max_context_len;
    o.kv_cache_tokens = kv_cache_tokens;
    o.max_running_requests = rows;
    return o;
  }

  void submit(uint64_t id, const V& prompt, int max_new_tokens) {
    EngineRequest r;
    r.prompt_ids = prompt;
    r.max_new_tokens = max_new_tokens;
    r.ignore_eos = true;
    scheduler.validate(r);
    scheduler.submit(id, r, [this](const StreamChunk& c) {
      if (c.finished) outputs[c.id] = *c.output;
    });
  }
  void run_until_idle() {
    while (scheduler.step()) {
    }
  }
  const RecordedBatch& batch(size_t i) const { return model.batches().at(i); }

  ModelRunner runner;
  FakeModel& model;
  Scheduler scheduler;
  std::map<uint64_t, RequestOutput> outputs;
};

// Fresh random prompts each run (the seed is printed on failure). A distinct first token per
// request keeps prompts from sharing prefix-cache pages by chance.
struct Prompts {
  Prompts() : seed(std::random_device{}()), rng(seed) {}
  V make(int len, int32_t first) {
    std::uniform_int_distribution<int32_t> token(0, FakeModel::kVocab - 1);
    V p(static_cast<size_t>(len));
    for (int32_t& t : p) t = token(rng);
    p[0] = first;
    return p;
  }
  std::string trace() const { return "prompt seed " + std::to_string(seed); }
  unsigned seed;
  std::mt19937 rng;
};

void expect_extend(const RecordedBatch& b, ForwardMode mode, const V& prefix_lens, const V& extend_lens,
                   const V& seq_lens) {
  EXPECT_EQ(b.mode, mode);
  EXPECT_EQ(b.batch_size, static_cast<int>(seq_lens.size()));
  EXPECT_EQ(b.extend_prefix_lens, prefix_lens);
  EXPECT_EQ(b.extend_seq_lens, extend_lens);
  EXPECT_EQ(b.seq_lens, seq_lens);
}

void expect_decode(const RecordedBatch& b, const V& seq_lens) {
  EXPECT_EQ(b.mode, ForwardMode::DECODE);
  EXPECT_EQ(b.batch_size, static_cast<int>(seq_lens.size()));
  EXPECT_EQ(b.seq_lens, seq_lens);
}

// Admission reserves, per request, its uncached prompt in whole pages plus new_token_ratio times
// its output budget; room = free + evictable - reserved. schedule_conservativeness 2 makes the
// ratio min(1, 0.7 * 2) = 1 exactly. Page 4, 128 KV tokens:
//   A (prompt 10, 20 new): need 12 + 20 = 32 <= 128; 12 allocated, 20 reserved
//   B (prompt 30, 30 new): need 32 + 30 = 62 <= 116 - 20; 32 allocated, 50 reserved
//   C (prompt 20, M new):  need 20 + M vs room 84 - 50 = 34: admitted iff M <= 14
//   D (prompt 1, 1 new):   need 5; after C (M = 14) room is 64 - 64 = 0; without C, admission
//                          stopped at C (first come, first served), though D would fit.
TEST(Scheduler, AdmissionStopsWhereTheKvCannotHoldTheNextPrompt) {
  for (int c_new : {14, 15}) {
    Prompts prompts;
    SCOPED_TRACE(prompts.trace() + ", C's max_new_tokens " + std::to_string(c_new));
    SchedulerOptions o = scheduler_options(/*chunk=*/0, /*mixed=*/true);
    o.schedule_conservativeness = 2.0;
    Harness h(4, 64, 128, o);
    const std::vector<V> p = {prompts.make(10, 1), prompts.make(30, 2), prompts.make(20, 3), prompts.make(1, 4)};
    const std::vector<int> max_new = {20, 30, c_new, 1};
    for (size_t i = 0; i < p.size(); ++i) h.submit(i, p[i], max_new[i]);
    ASSERT_TRUE(h.scheduler.step());
    if (c_new == 14) {
      expect_extend(h.batch(0), ForwardMode::EXTEND, {0, 0, 0}, {10, 30, 20}, {10, 30, 20});
      EXPECT_EQ(h.scheduler.stats().waiting, 1);
    } else {
      expect_extend(h.batch(0), ForwardMode::EXTEND, {0, 0}, {10, 30}, {10, 30});
      EXPECT_EQ(h.scheduler.stats().waiting, 2);
    }
    h.run_until_idle();
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(h.outputs.at(i).finish_reason, "length");
      EXPECT_EQ(h.outputs.at(i).output_ids, FakeModel::continuation(p[i], max_new[i])) << "request " << i;
    }
  }
}

// Chunks of 8 over a 21-token prompt: EXTENDs of 8, 8 and 5 tokens, each after the KV of the
// previous ones, then one DECODE per further token. Slots follow pages: position p sits at
// offset p % page_size of its page.
TEST(Scheduler, ChunkedPrefillRunsChunkSizedExtends) {
  for (int page : {1, 4, 16}) {
    Prompts prompts;
    SCOPED_TRACE(prompts.trace() + ", page " + std::to_string(page));
    Harness h(page, 64, 0, scheduler_options(/*chunk=*/8, /*mixed=*/false));
    const V p = prompts.make(21, 1);
    h.submit(7, p, 3);
    h.run_until_idle();
    ASSERT_EQ(h.model.batches().size(), 5u);
    expect_extend(h.batch(0), ForwardMode::EXTEND, {0}, {8}, {8});
    expect_extend(h.batch(1), ForwardMode::EXTEND, {8}, {8}, {16});
    expect_extend(h.batch(2), ForwardMode::EXTEND, {16}, {5}, {21});
    EXPECT_EQ(h.batch(1).input_ids, V(p.begin() + 8, p.begin() + 16));
    EXPECT_EQ(h.batch(1).positions, V({8, 9, 10, 11, 12, 13, 14, 15}));
    expect_decode(h.batch(3), {22});
    expect_decode(h.batch(4), {23});
    for (const RecordedBatch& b : h.model.batches()) {
      for (size_t t = 0; t < b.positions.size(); ++t) EXPECT_EQ(b.out_cache_loc[t] % page, b.positions[t] % page);
    }
    EXPECT_EQ(h.outputs.at(7).output_ids, FakeModel::continuation(p, 3));
    EXPECT_EQ(h.scheduler.stats().prefill_tokens, 21);
    EXPECT_EQ(h.scheduler.stats().decode_tokens, 3);
    EXPECT_EQ(h.scheduler.stats().prefill_only_steps, 3);  // the three chunks; decodes not counted
    EXPECT_GT(h.scheduler.stats().prefill_only_s, 0.0);
  }
}

// With mixed chunks a step's budget of 8 tokens holds A's decode and 7 tokens of B's prompt:
// prefill rows first, then decodes, until B's 20 tokens (7 + 7 + 6) have run; then both decode
// (running order: A, then B) until B has its 2 tokens.
TEST(Scheduler, MixedStepsCombineDecodesAndAChunk) {
  Prompts prompts;
  SCOPED_TRACE(prompts.trace());
  Harness h(4, 64, 0, scheduler_options(/*chunk=*/8, /*mixed=*/true));
  const V a = prompts.make(4, 1), b = prompts.make(20, 2);
  h.submit(1, a, 10);
  ASSERT_TRUE(h.scheduler.step());
  h.submit(2, b, 2);
  h.run_until_idle();
  expect_extend(h.batch(0), ForwardMode::EXTEND, {0}, {4}, {4});
  expect_extend(h.batch(1), ForwardMode::MIXED, {0, 4}, {7, 1}, {7, 5});
  expect_extend(h.batch(2), ForwardMode::MIXED, {7, 5}, {7, 1}, {14, 6});
  expect_extend(h.batch(3), ForwardMode::MIXED, {14, 6}, {6, 1}, {20, 7});
  expect_decode(h.batch(4), {8, 21});  // B's second and last token (its first came from its prefill)
  expect_decode(h.batch(5), {9});
  EXPECT_EQ(h.model.batches().size(), 10u);  // A: 5 tokens so far, 5 more alone
  EXPECT_EQ(h.scheduler.stats().prefill_only_steps, 1);  // A's prompt alone; B's chunks rode in MIXED steps
  EXPECT_EQ(h.outputs.at(1).output_ids, FakeModel::continuation(a, 10));
  EXPECT_EQ(h.outputs.at(2).output_ids, FakeModel::continuation(b, 2));
}

// A (18-token prompt, 3 new tokens) leaves 20 tokens in the cache: its prompt and the 2 outputs
// that ran, whole pages of 4. B shares A's first 14 prompt tokens: 12 of them (whole pages) are
// read from the cache and B's first EXTEND runs only its last 8.
TEST(Scheduler, SharedPrefixIsServedFromTheRadixCache) {
  Prompts prompts;
  SCOPED_TRACE(prompts.trace());
  Harness h(4, 64, 0, scheduler_options(/*chunk=*/0, /*mixed=*/true));
  const V a = prompts.make(18, 1);
  h.submit(1, a, 3);
  h.run_until_idle();
  EXPECT_EQ(h.scheduler.stats().kv_cached_tokens, 20);
  V b(a.begin(), a.begin() + 14);
  const V tail = prompts.make(6, (a[14] + 1) % FakeModel::kVocab);
  b.insert(b.end(), tail.begin(), tail.end());
  h.model.clear_batches();
  h.submit(2, b, 4);
  h.run_until_idle();
  expect_extend(h.batch(0), ForwardMode::EXTEND, {12}, {8}, {20});
  EXPECT_EQ(h.batch(0).input_ids, V(b.begin() + 12, b.end()));
  EXPECT_EQ(h.outputs.at(2).cached_tokens, 12);
  EXPECT_EQ(h.scheduler.stats().cached_tokens, 12);
  EXPECT_EQ(h.scheduler.stats().prefill_tokens, 18 + 8);
  EXPECT_EQ(h.outputs.at(1).output_ids, FakeModel::continuation(a, 3));
  EXPECT_EQ(h.outputs.at(2).output_ids, FakeModel::continuation(b, 4));
}

// Decode KV runs out: the scheduler evicts unlocked cache pages first and retracts only when
// none are left, choosing the running request with the fewest output tokens (then the longest
// prompt). Page 4, 48 KV tokens (12 pages), context 32; schedule_conservativeness 0.01 reserves
// no future tokens, so admission fills the cache with prompts:
//   step 1      W (prompt 8, 1 new) runs and finishes: its 2 pages stay cached, unlocked
//   step 2      X (prompt 18, 14 new) takes 5 pages            -> 5 free
//   step 3      MIXED: Y (prompt 10, 20 new) takes 3, X decodes -> 2 free; X leads Y by 1 token
//   steps 5, 6  X reaches position 20, Y position 12: a new page each -> 0 free
//   step 9      X reaches position 24: W's 2 cached pages are evicted (cache 32 -> 24 tokens)
//   step 13     X reaches position 28, nothing evictable: Y (10 outputs to X's 11, though its
//               prompt is shorter) is retracted; its 16 page-aligned tokens go to the cache
//   steps 13-15 X decodes alone to its 14 tokens; Y's 4-token re-run does not fit until then
//   step 16     Y resumes from its cached 16 tokens: EXTEND of the last 4
TEST(Scheduler, FullKvEvictsCacheThenRetractsTheFewestOutputs) {
  Prompts prompts;
  SCOPED_TRACE(prompts.trace());
  const V w = prompts.make(8, 1), x = prompts.make(18, 2), y = prompts.make(10, 3);
  auto run = [&](int64_t kv_cache_tokens, std::vector<SchedulerStats>* per_step) {
    SchedulerOptions o = scheduler_options(/*chunk=*/0, /*mixed=*/true);
    o.schedule_conservativeness = 0.01;
    auto h = std::make_unique<Harness>(4, 32, kv_cache_tokens, o);
    h->submit(1, w, 1);
    h->scheduler.step();
    h->submit(2, x, 14);
    h->scheduler.step();
    h->submit(3, y, 20);
    while (h->scheduler.step()) {
      if (per_step != nullptr) per_step->push_back(h->scheduler.stats());
    }
    return h;
  };
  std::vector<SchedulerStats> s;  // after steps 3, 4, ...
  const auto tight = run(48, &s);
  auto after_step = [&](size_t step) { return s.at(step - 3); };
  EXPECT_EQ(after_step(8).kv_cached_tokens, 32);
  EXPECT_EQ(after_step(9).kv_cached_tokens, 24);
  EXPECT_EQ(after_step(12).retractions, 0);
  EXPECT_EQ(after_step(13).retractions, 1);
  EXPECT_EQ(s.back().retractions, 1);
  expect_extend(tight->batch(2), ForwardMode::MIXED, {0, 18}, {10, 1}, {10, 19});
  expect_decode(tight->batch(11), {28, 19});
  expect_decode(tight->batch(12), {29});
  expect_decode(tight->batch(14), {31});
  expect_extend(tight->batch(15), ForwardMode::EXTEND, {16}, {4}, {20});
  EXPECT_EQ(tight->outputs.at(2).retractions, 0);
  EXPECT_EQ(tight->outputs.at(3).retractions, 1);

  const auto roomy = run(0, nullptr);
  EXPECT_EQ(roomy->scheduler.stats().retractions, 0);
  for (uint64_t id : {1, 2, 3}) {
    EXPECT_EQ(tight->outputs.at(id).finish_reason, "length");
    EXPECT_EQ(tight->outputs.at(id).output_ids, roomy->outputs.at(id).output_ids) << "request " << id;
  }
  EXPECT_EQ(tight->outputs.at(3).output_ids, FakeModel::continuation(y, 20));
  const SchedulerStats end = tight->scheduler.stats();
  EXPECT_EQ(end.kv_free_tokens + end.kv_cached_tokens, end.kv_total_tokens);
}

TEST(Scheduler, QueueOverflowThrowsNamingTheLimit) {
  Prompts prompts;
  SCOPED_TRACE(prompts.trace());
  SchedulerOptions o = scheduler_options(/*chunk=*/0, /*mixed=*/true);
  o.max_queued_requests = 2;
  Harness h(4, 64, 0, o);
  h.submit(1, prompts.make(5, 1), 2);
  h.submit(2, prompts.make(5, 2), 2);
  try {
    h.submit(3, prompts.make(5, 3), 2);
    FAIL() << "a third waiting request was queued";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the queue is full (2 requests waiting, max_queued_requests 2); try again later");
  }
  // Admitted requests leave the queue.
  ASSERT_TRUE(h.scheduler.step());
  EXPECT_EQ(h.scheduler.stats().waiting, 0);
  h.submit(3, prompts.make(5, 3), 2);
  h.run_until_idle();
  EXPECT_EQ(h.outputs.size(), 3u);
}

// Cancelling a decoding request, one in the middle of a chunked prefill and a waiting one hands
// back every KV slot and request row (into the prefix cache where there is one).
TEST(Scheduler, CancelFreesTheKv) {
  for (bool radix : {false, true}) {
    Prompts prompts;
    SCOPED_TRACE(prompts.trace() + (radix ? ", radix cache" : ", no radix cache"));
    Harness h(4, 64, 0, scheduler_options(/*chunk=*/8, /*mixed=*/true, radix), /*max_running_requests=*/2);
    const int64_t total = h.scheduler.stats().kv_total_tokens;
    EXPECT_EQ(h.scheduler.stats().kv_free_tokens, total);
    h.submit(1, prompts.make(5, 1), 50);
    h.submit(2, prompts.make(30, 2), 5);
    h.submit(3, prompts.make(9, 3), 5);
    // Step 1: A's 5 tokens and 3 of B's; step 2: A decodes, 7 more of B's; C waits for a row.
    h.scheduler.step();
    h.scheduler.step();
    EXPECT_EQ(h.scheduler.stats().running, 2);
    EXPECT_EQ(h.scheduler.stats().waiting, 1);
    EXPECT_TRUE(h.scheduler.cancel(2));
    EXPECT_TRUE(h.scheduler.cancel(3));
    h.scheduler.step();
    EXPECT_TRUE(h.scheduler.cancel(1));
    EXPECT_FALSE(h.scheduler.cancel(1));
    EXPECT_FALSE(h.scheduler.cancel(99));
    for (uint64_t id : {1, 2, 3}) EXPECT_EQ(h.outputs.at(id).finish_reason, "cancelled");
    const SchedulerStats s = h.scheduler.stats();
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.waiting, 0);
    EXPECT_EQ(s.kv_free_tokens + s.kv_cached_tokens, total);
    EXPECT_EQ(s.kv_cached_tokens > 0, radix);
    h.scheduler.flush_cache();
    EXPECT_EQ(h.scheduler.stats().kv_free_tokens, total);
    EXPECT_EQ(h.runner.req_pool().available_size(), h.runner.req_pool().size());
  }
}

// The grammar vocabulary the Engine builds while the model loads reaches the scheduler as a future.
// The first constrained request takes it, waiting while the build still runs; a build that failed
// fails only the request that asked, and the next one builds the vocabulary itself. The shipped
// byte tokenizer's ids 0..63 are bytes 0..63, the fake model's whole vocabulary, digits among them.
TEST(Scheduler, TheFirstConstrainedRequestTakesTheVocabularyBeingBuilt) {
  const Tokenizer tokenizer =
      Tokenizer::from_folder(std::filesystem::path(SPECULA_SOURCE_DIR) / "models" / "specula-byte-6m");
  ModelRunner runner(std::make_unique<FakeModel>(), Harness::runner_options(4, 128, 512, 8));
  using Built = std::shared_ptr<const grammar::Vocabulary>;
  std::map<uint64_t, RequestOutput> outputs;
  const auto submit = [&](Scheduler& scheduler, uint64_t id) {
    EngineRequest r;
    r.prompt_ids = {7, 9, 11};
    r.max_new_tokens = 10;
    r.format.kind = grammar::OutputFormat::Kind::kRegex;
    r.format.source = "[0-9]{3}";
    scheduler.validate(r);
    scheduler.submit(id, r, [&](const StreamChunk& c) {
      if (c.finished) outputs[c.id] = *c.output;
    });
  };
  const auto expect_digits = [&](Scheduler& scheduler, uint64_t id) {
    while (scheduler.step()) {
    }
    const RequestOutput& out = outputs.at(id);
    EXPECT_EQ(out.finish_reason, "stop") << out.text;
    ASSERT_EQ(out.text.size(), 3u) << out.text;
    for (char c : out.text) EXPECT_TRUE(c >= '0' && c <= '9') << out.text;
  };
  {
    std::promise<Built> build;
    Scheduler scheduler(runner, &tokenizer, scheduler_options(0, false), nullptr, build.get_future());
    build.set_exception(std::make_exception_ptr(std::bad_alloc()));
    EXPECT_THROW(submit(scheduler, 1), std::bad_alloc);
    submit(scheduler, 2);
    expect_digits(scheduler, 2);
    EXPECT_EQ(outputs.count(1), 0u);
  }
  {
    std::promise<Built> build;
    Scheduler scheduler(runner, &tokenizer, scheduler_options(0, false), nullptr, build.get_future());
    std::atomic<bool> handed_over{false};
    std::thread builder([&] {
      Built vocabulary = grammar_vocabulary(tokenizer, FakeModel::kVocab);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      handed_over = true;
      build.set_value(std::move(vocabulary));
    });
    submit(scheduler, 3);
    // The submit returned only once the build it was given had finished (a scheduler that built
    // its own would return while the builder sleeps).
    EXPECT_TRUE(handed_over.load());
    builder.join();
    expect_digits(scheduler, 3);
  }
}

}  // namespace
}  // namespace specula
