// The serving runtime on a GPU: in deterministic mode a batch's greedy outputs equal each
// request's output alone, with and without CUDA graphs (batches padded up to a captured size),
// and under KV pressure; the fast mode completes the same workload. Built in
// CUDA builds; skipped where no GPU is visible. Sampled rows under a grammar (whose masks the host
// fills while the GPU runs the step) fit their grammar and draw in a batch what they draw alone.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "runtime/engine_fixtures.h"
#include "specula/grammar/output_format.h"
#include "specula/runtime/engine.h"

namespace specula {
namespace {

using testing_fixtures::greedy;
using testing_fixtures::kModel;
using testing_fixtures::kTexts;

EngineOptions gpu_options(int page_size, bool graphs) {
  EngineOptions o;
  o.background_thread = false;
  o.runner.device = Device::cuda(0);
  o.runner.page_size = page_size;
  o.runner.max_context_len = 256;
  o.runner.max_running_requests = 16;
  o.runner.cuda_graph = graphs;
  // Batch invariance on the GPU needs the deterministic mode (the fast mode picks GEMV or
  // tensor-core GEMMs by row count, whose f32 sums round differently).
  o.runner.deterministic = true;
  o.runner.cuda_graph_batch_sizes = {1, 2, 4, 8, 16};
  o.scheduler.log_retractions = false;
  return o;
}


std::vector<std::vector<int32_t>> run(Engine& engine, int max_new) { return testing_fixtures::run_greedy(engine, kTexts, max_new); }

TEST(CudaEngine, BatchMatchesAloneWithAndWithoutGraphs) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (int page : {1, 16}) {
    SCOPED_TRACE(page);
    std::vector<std::vector<int32_t>> alone;
    {
      EngineOptions o = gpu_options(page, false);
      o.runner.max_running_requests = 1;
      Engine engine(kModel, o);
      for (const std::string& t : kTexts) {
        auto h = engine.submit(greedy(t, 32));
        engine.run_until_idle();
        alone.push_back(h->wait().output_ids);
      }
    }
    for (bool graphs : {false, true}) {
      SCOPED_TRACE(graphs ? "graphs" : "eager");
      Engine engine(kModel, gpu_options(page, graphs));
      EXPECT_EQ(engine.runner().cuda_graph_batch_sizes(), graphs ? std::vector<int>({1, 2, 4, 8, 16}) : std::vector<int>{});
      const int64_t free_at_start = engine.runner().allocator().available_size();
      const auto outs = run(engine, 32);
      for (size_t i = 0; i < kTexts.size(); ++i) EXPECT_EQ(outs[i], alone[i]) << kTexts[i];
      engine.flush_cache();
      EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
    }
    // A KV cache of one context: requests are retracted and recomputed and all complete. A
    // request never retracted decodes exactly as alone. A recomputed one re-creates its KV with a
    // prefill (bf16 K/V from different GEMM and attention kernels than decode's), so a near-tie
    // token can flip later on; the CPU test (f32) checks those for identity too.
    EngineOptions tight = gpu_options(page, true);
    tight.runner.kv_cache_tokens = 256;
    tight.scheduler.schedule_conservativeness = 0.01;
    Engine engine(kModel, tight);
    const int64_t free_at_start = engine.runner().allocator().available_size();
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const std::string& t : kTexts) handles.push_back(engine.submit(greedy(t, 32)));
    engine.run_until_idle();
    EXPECT_GT(engine.stats().retractions, 0);
    int identical = 0, retracted = 0;
    for (size_t i = 0; i < kTexts.size(); ++i) {
      const RequestOutput out = handles[i]->wait();
      ASSERT_EQ(out.finish_reason, "length");
      ASSERT_EQ(out.output_ids.size(), 32u);
      retracted += out.retractions > 0;
      identical += out.output_ids == alone[i];
      if (out.retractions == 0) {
        EXPECT_EQ(out.output_ids, alone[i]) << kTexts[i];
      }
    }
    EXPECT_GT(retracted, 0);
    EXPECT_LT(retracted, static_cast<int>(kTexts.size()));  // some ran through untouched
    engine.flush_cache();
    EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
    std::printf("page %d: %d of %zu requests retracted; %d of %zu outputs identical to alone\n", page, retracted,
                kTexts.size(), identical, kTexts.size());
  }
}

TEST(CudaEngine, FastModeCompletesTheBatch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  EngineOptions o = gpu_options(16, true);
  o.runner.deterministic = false;
  Engine engine(kModel, o);
  const auto outs = run(engine, 32);
  for (const auto& out : outs) EXPECT_EQ(out.size(), 32u);
  EXPECT_EQ(engine.stats().finished, static_cast<int64_t>(kTexts.size()));
}

TEST(CudaEngine, SampledRowsUnderAGrammarFitItAndDrawWhatTheyDrawAlone) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto format = [](grammar::OutputFormat::Kind kind, std::string source) {
    grammar::OutputFormat f;
    f.kind = kind;
    f.source = std::move(source);
    grammar::compile(f);
    return f;
  };
  const std::vector<grammar::OutputFormat> formats = {format(grammar::OutputFormat::Kind::kJsonObject, ""),
                                                      format(grammar::OutputFormat::Kind::kRegex, "[a-z ]{20,40}\\.")};
  const auto request = [&](size_t k) {
    EngineRequest r;
    r.prompt = kTexts[k];
    r.max_new_tokens = 48;
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 100 + k;
    r.format = formats[k % formats.size()];
    return r;
  };
  std::vector<RequestOutput> alone;
  {
    EngineOptions o = gpu_options(16, true);
    o.runner.max_running_requests = 1;
    Engine engine(kModel, o);
    for (size_t k = 0; k < kTexts.size(); ++k) {
      auto h = engine.submit(request(k));
      engine.run_until_idle();
      alone.push_back(h->wait());
    }
  }
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    Engine engine(kModel, gpu_options(16, graphs));
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (size_t k = 0; k < kTexts.size(); ++k) handles.push_back(engine.submit(request(k)));
    engine.run_until_idle();
    int stopped = 0;
    for (size_t k = 0; k < kTexts.size(); ++k) {
      const RequestOutput out = handles[k]->wait();
      ASSERT_TRUE(out.finish_reason == "stop" || out.finish_reason == "length") << k << ": " << out.finish_reason;
      EXPECT_EQ(out.output_ids, alone[k].output_ids) << kTexts[k];
      const grammar::Automaton& a = *formats[k % formats.size()].automaton;
      grammar::MatchState st = a.start();
      for (char c : out.text) st = a.advance(st, static_cast<uint8_t>(c));
      EXPECT_FALSE(st.dead()) << k << ": " << out.text;
      if (out.finish_reason == "stop") {
        EXPECT_TRUE(a.can_end(st)) << k << ": " << out.text;
        ++stopped;
      }
    }
    std::printf("%s: %d of %zu sampled documents finished within 48 tokens\n", graphs ? "graphs" : "eager", stopped,
                kTexts.size());
  }
}

}  // namespace
}  // namespace specula
