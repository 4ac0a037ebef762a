// The serving runtime on the shipped model (CPU): batching, the prefix cache, chunked prefill,
// retraction under KV pressure and cancellation must never change a request's greedy output or
// leak a KV slot. "Alone" outputs come from an engine that runs one request at a time.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <stdexcept>
#include <thread>

#include "specula/core/error.h"
#include "runtime/engine_fixtures.h"
#include "specula/runtime/engine.h"

namespace specula {
namespace {

using testing_fixtures::greedy;
using testing_fixtures::kModel;
using testing_fixtures::kTexts;

EngineOptions options(int page_size, bool radix, bool mixed, int chunk = 4096) {
  EngineOptions o;
  o.background_thread = false;
  o.runner.page_size = page_size;
  o.runner.max_context_len = 256;
  o.runner.max_running_requests = 16;
  o.scheduler.disable_radix_cache = !radix;
  o.scheduler.enable_mixed_chunk = mixed;
  o.scheduler.chunked_prefill_size = chunk;
  o.scheduler.log_retractions = false;
  return o;
}


// Each request's output when it runs by itself (computed once per page size and cached).
const std::vector<int32_t>& alone(const std::string& text, int max_new, int page_size) {
  static std::map<std::tuple<std::string, int, int>, std::vector<int32_t>> memo;
  auto key = std::make_tuple(text, max_new, page_size);
  auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  EngineOptions o = options(page_size, false, false);
  o.runner.max_running_requests = 1;
  Engine engine(kModel, o);
  auto h = engine.submit(greedy(text, max_new));
  engine.run_until_idle();
  const RequestOutput out = h->wait();
  EXPECT_EQ(out.finish_reason, "length");
  EXPECT_EQ(static_cast<int>(out.output_ids.size()), max_new);
  return memo.emplace(key, out.output_ids).first->second;
}

struct Case {
  int page_size;
  bool radix;
  bool mixed;
  int chunk;
};

class EngineBatch : public ::testing::TestWithParam<Case> {};

TEST_P(EngineBatch, EveryRequestMatchesItsOutputAlone) {
  const Case c = GetParam();
  Engine engine(kModel, options(c.page_size, c.radix, c.mixed, c.chunk));
  const int64_t free_at_start = engine.runner().allocator().available_size();
  std::vector<std::shared_ptr<RequestHandle>> handles;
  // Half join at once, the rest while the first ones decode (continuous batching).
  for (size_t i = 0; i < kTexts.size() / 2; ++i) handles.push_back(engine.submit(greedy(kTexts[i])));
  for (int s = 0; s < 5; ++s) engine.step();
  for (size_t i = kTexts.size() / 2; i < kTexts.size(); ++i) handles.push_back(engine.submit(greedy(kTexts[i])));
  engine.run_until_idle();
  for (size_t i = 0; i < kTexts.size(); ++i) {
    const RequestOutput out = handles[i]->wait();
    EXPECT_EQ(out.finish_reason, "length") << kTexts[i];
    EXPECT_EQ(out.output_ids, alone(kTexts[i], 24, c.page_size)) << kTexts[i];
  }
  const SchedulerStats s = engine.stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.finished, static_cast<int64_t>(kTexts.size()));
  EXPECT_EQ(s.decode_tokens, static_cast<int64_t>(kTexts.size() * 24));
  EXPECT_EQ(s.kv_free_tokens + s.kv_cached_tokens, free_at_start);
  engine.flush_cache();
  EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
  EXPECT_EQ(engine.runner().req_pool().available_size(), engine.runner().req_pool().size());
}

INSTANTIATE_TEST_SUITE_P(Runtime, EngineBatch,
                         ::testing::Values(Case{1, true, true, 4096}, Case{16, true, true, 4096},
                                           Case{1, false, false, 4096}, Case{16, false, true, 4096},
                                           Case{16, true, false, 4096}, Case{1, true, true, 7},
                                           Case{16, true, false, 5}, Case{16, false, true, 3}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return "page" + std::to_string(c.page_size) + (c.radix ? "_radix" : "_noradix") +
                                  (c.mixed ? "_mixed" : "_prefillfirst") + "_chunk" + std::to_string(c.chunk);
                         });

TEST(Engine, SharedPrefixIsComputedOnce) {
  for (int page : {1, 16}) {
    SCOPED_TRACE(page);
    Engine engine(kModel, options(page, true, true));
    // 96 shared tokens (BOS and 95 bytes: whole pages), then a distinct tail per request.
    std::string prefix;
    while (prefix.size() < 95) prefix += "All work and no play makes Jack a dull boy. ";
    prefix.resize(95);
    const std::vector<std::string> tails = {"Then", "However, the", "Suddenly a loud", "Why", "1 2 3", "And so"};
    std::vector<std::shared_ptr<RequestHandle>> handles;
    int64_t tail_tokens = 0;
    for (const std::string& t : tails) {
      handles.push_back(engine.submit(greedy(prefix + t, 8)));
      tail_tokens += static_cast<int64_t>(engine.tokenizer()->encode(prefix + t).size()) - 96;
    }
    engine.run_until_idle();
    ASSERT_EQ(engine.tokenizer()->encode(prefix).size(), 96u);  // byte-level: BOS, then one token per byte
    const SchedulerStats s = engine.stats();
    EXPECT_EQ(s.prefill_tokens, 96 + tail_tokens);
    EXPECT_EQ(s.cached_tokens, 96 * static_cast<int64_t>(tails.size() - 1));
    for (size_t i = 0; i < tails.size(); ++i) {
      const RequestOutput out = handles[i]->wait();
      EXPECT_EQ(out.cached_tokens, i == 0 ? 0 : 96);
      EXPECT_EQ(out.output_ids, alone(prefix + tails[i], 8, page)) << tails[i];
    }
    // A later request with the same prompt reuses all of it but its last token.
    auto again = engine.submit(greedy(prefix + tails[0], 8));
    engine.run_until_idle();
    EXPECT_EQ(again->wait().output_ids, alone(prefix + tails[0], 8, page));
    const int64_t full = static_cast<int64_t>(engine.tokenizer()->encode(prefix + tails[0]).size());
    EXPECT_EQ(again->wait().cached_tokens, (full - 1) / page * page);
  }
}

TEST(Engine, FullKVCacheRetractsAndStillMatches) {
  for (int page : {1, 16}) {
    for (bool radix : {false, true}) {
      SCOPED_TRACE(testing::Message() << "page " << page << " radix " << radix);
      EngineOptions o = options(page, radix, true);
      // Room for one full context only, and admission that reserves almost nothing ahead: the
      // running requests outgrow the cache while decoding.
      o.runner.kv_cache_tokens = 256;
      o.scheduler.schedule_conservativeness = 0.01;
      Engine engine(kModel, o);
      const int64_t free_at_start = engine.runner().allocator().available_size();
      std::vector<std::shared_ptr<RequestHandle>> handles;
      for (const std::string& t : kTexts) handles.push_back(engine.submit(greedy(t, 40)));
      engine.run_until_idle();
      EXPECT_GT(engine.stats().retractions, 0);
      int retracted = 0;
      for (size_t i = 0; i < kTexts.size(); ++i) {
        const RequestOutput out = handles[i]->wait();
        retracted += out.retractions > 0;
        EXPECT_EQ(out.output_ids, alone(kTexts[i], 40, page)) << kTexts[i];
      }
      EXPECT_GT(retracted, 0);
      engine.flush_cache();
      EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
    }
  }
}

TEST(Engine, StreamedChunksAddUpToTheOutput) {
  Engine engine(kModel, options(16, true, true, 5));
  std::string streamed_text;
  std::vector<int32_t> streamed_ids;
  int finished_chunks = 0;
  EngineRequest r = greedy(kTexts[1], 30);
  r.stop_strings = {"zzqq"};  // never produced: holds back a 3-byte tail until the end
  auto h = engine.submit(r, [&](const StreamChunk& c) {
    streamed_text += c.text;
    streamed_ids.insert(streamed_ids.end(), c.token_ids.begin(), c.token_ids.end());
    finished_chunks += c.finished;
  });
  engine.run_until_idle();
  const RequestOutput out = h->wait();
  EXPECT_EQ(finished_chunks, 1);
  EXPECT_EQ(streamed_ids, out.output_ids);
  EXPECT_EQ(streamed_text, out.text);
  EXPECT_FALSE(out.text.empty());
  // The handle saw the same chunks.
  std::string via_handle;
  while (auto c = h->next()) via_handle += c->text;
  EXPECT_EQ(via_handle, out.text);
  EXPECT_EQ(out.token_times_s.size(), out.output_ids.size());
  EXPECT_GT(out.time_to_first_token_s, 0);
  EXPECT_GE(out.latency_s, out.time_to_first_token_s);
}

TEST(Engine, AThrowingCallbackDoesNotDisturbTheEngine) {
  Engine engine(kModel, options(16, true, true));
  int calls = 0;
  auto bad = engine.submit(greedy(kTexts[0], 12), [&](const StreamChunk&) {
    ++calls;
    throw std::runtime_error("client went away");
  });
  auto good = engine.submit(greedy(kTexts[1], 12));
  engine.run_until_idle();
  EXPECT_GT(calls, 1);
  const RequestOutput a = bad->wait(), b = good->wait();
  EXPECT_EQ(a.finish_reason, "length");
  EXPECT_EQ(a.output_ids, alone(kTexts[0], 12, 16));
  EXPECT_EQ(b.output_ids, alone(kTexts[1], 12, 16));
}

TEST(Engine, CancelReleasesEverySlot) {
  for (bool radix : {false, true}) {
    Engine engine(kModel, options(16, radix, true, 16));
    PagedTokenAllocator& alloc = engine.runner().allocator();
    const int64_t free_at_start = alloc.available_size();
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const std::string& t : kTexts) handles.push_back(engine.submit(greedy(t, 100)));
    for (int s = 0; s < 6; ++s) engine.step();
    ASSERT_GT(engine.stats().running, 0);
    ASSERT_LT(alloc.available_size(), free_at_start);
    for (const auto& h : handles) EXPECT_TRUE(engine.cancel(h->id()));
    engine.run_until_idle();
    for (const auto& h : handles) EXPECT_EQ(h->wait().finish_reason, "cancelled");
    EXPECT_FALSE(engine.cancel(999999));
    if (!radix) {
      EXPECT_EQ(alloc.available_size(), free_at_start);
    }
    engine.flush_cache();
    EXPECT_EQ(alloc.available_size(), free_at_start);
    EXPECT_EQ(engine.runner().req_pool().available_size(), engine.runner().req_pool().size());
  }
}

TEST(Engine, RandomSubmitCancelFinishLeaksNoSlot) {
  for (bool radix : {false, true}) {
    SCOPED_TRACE(radix);
    EngineOptions o = options(4, radix, true, 24);
    o.runner.max_context_len = 96;
    o.runner.max_running_requests = 6;
    o.runner.kv_cache_tokens = 160;  // tight: retractions happen
    o.scheduler.schedule_conservativeness = 0.05;
    Engine engine(kModel, o);
    PagedTokenAllocator& alloc = engine.runner().allocator();
    const int64_t free_at_start = alloc.available_size();
    std::mt19937 rng(1234 + radix);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    std::vector<int> max_new;
    const std::string common = "shared prefix for the cache: ";
    for (int op = 0; op < 1000; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 3) {
        EngineRequest r;
        const int len = 1 + static_cast<int>(rng() % 40);
        if (rng() % 2 == 0) r.prompt_ids.assign(common.begin(), common.end());
        for (int i = 0; i < len; ++i) r.prompt_ids.push_back(static_cast<int32_t>(32 + rng() % 90));
        r.max_new_tokens = static_cast<int>(rng() % 30);
        r.ignore_eos = true;
        if (rng() % 4 == 0) {
          r.sampling.temperature = 0.8f;
          r.sampling.seed = rng();
        }
        max_new.push_back(std::min(r.max_new_tokens, 96 - static_cast<int>(r.prompt_ids.size())));
        handles.push_back(engine.submit(std::move(r)));
      } else if (kind < 4 && !handles.empty()) {
        engine.cancel(handles[rng() % handles.size()]->id());
      } else {
        engine.step();
      }
    }
    engine.run_until_idle();
    int cancelled = 0, completed = 0;
    for (size_t i = 0; i < handles.size(); ++i) {
      ASSERT_TRUE(handles[i]->finished());
      const RequestOutput out = handles[i]->wait();
      if (out.finish_reason == "cancelled") {
        ++cancelled;
        EXPECT_LE(static_cast<int>(out.output_ids.size()), max_new[i]);
      } else {
        ++completed;
        EXPECT_EQ(out.finish_reason, "length");
        EXPECT_EQ(static_cast<int>(out.output_ids.size()), max_new[i]);
      }
    }
    EXPECT_GT(cancelled, 0);
    EXPECT_GT(completed, 0);
    EXPECT_GT(engine.stats().retractions, 0);
    engine.flush_cache();
    EXPECT_EQ(alloc.available_size(), free_at_start);
    EXPECT_EQ(engine.runner().req_pool().available_size(), engine.runner().req_pool().size());
  }
}

TEST(Engine, BadRequestsAndAFullQueueAreClearErrors) {
  EngineOptions o = options(16, true, true);
  o.scheduler.max_queued_requests = 2;
  Engine engine(kModel, o);
  EngineRequest empty;
  EXPECT_THROW(engine.submit(empty), Error);
  EngineRequest bad_id;
  bad_id.prompt_ids = {1, 2, 100000};
  try {
    engine.submit(bad_id);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("100000"), std::string::npos) << e.what();
  }
  EngineRequest too_long;
  too_long.prompt_ids.assign(256, 65);
  EXPECT_THROW(engine.submit(too_long), Error);
  EngineRequest bad_sampling = greedy("x");
  bad_sampling.sampling.top_p = 0;
  EXPECT_THROW(engine.submit(bad_sampling), Error);
  engine.submit(greedy("a"));
  engine.submit(greedy("b"));
  try {
    engine.submit(greedy("c"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("queue is full"), std::string::npos) << e.what();
  }
  engine.run_until_idle();
  EXPECT_EQ(engine.stats().finished, 2);
}

TEST(Engine, BackgroundThreadServesManyCallers) {
  EngineOptions o = options(16, true, true);
  o.background_thread = true;
  Engine engine(kModel, o);
  std::vector<std::thread> callers;
  std::vector<RequestOutput> outs(kTexts.size());
  for (size_t i = 0; i < kTexts.size(); ++i) {
    callers.emplace_back([&, i] { outs[i] = engine.submit(greedy(kTexts[i]))->wait(); });
  }
  for (auto& t : callers) t.join();
  for (size_t i = 0; i < kTexts.size(); ++i) EXPECT_EQ(outs[i].output_ids, alone(kTexts[i], 24, 16)) << kTexts[i];
  // A request still running when the engine goes away ends as cancelled.
  std::shared_ptr<RequestHandle> h;
  {
    Engine short_lived(kModel, o);
    h = short_lived.submit(greedy(kTexts[0], 200));
  }
  const RequestOutput out = h->wait();
  EXPECT_TRUE(out.finish_reason == "cancelled" || out.finish_reason == "length") << out.finish_reason;
}

}  // namespace
}  // namespace specula
