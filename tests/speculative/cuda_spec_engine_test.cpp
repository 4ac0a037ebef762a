// Speculative decoding with the target and the draft head on a GPU: the heads against the PyTorch
// reference's golden fixtures; greedy output equals the GPU target's own greedy output
// (deterministic mode on both sides, so that a token's logits do not depend on its batch), for
// both heads, chains and trees, page sizes 1 and 16, batches of 1 to 16, with CUDA graphs (draft
// loop and verify) and without; every KV slot returns. Built in CUDA builds; skipped where no GPU
// is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "runtime/engine_fixtures.h"
#include "speculative/eagle_golden.h"
#include "speculative/spec_fixtures.h"
#include "specula/runtime/engine.h"

namespace specula {
namespace {

using testing_fixtures::kModel;
using testing_fixtures::kTexts;

constexpr int kMaxNew = 40;

EngineOptions gpu_options(int page_size, int batch) {
  EngineOptions o;
  o.background_thread = false;
  o.runner.device = Device::cuda(0);
  o.runner.page_size = page_size;
  o.runner.max_context_len = 320;
  o.runner.max_running_requests = batch;
  o.runner.deterministic = true;
  o.scheduler.log_retractions = false;
  return o;
}

std::vector<std::vector<int32_t>> run(Engine& engine, const std::vector<std::string>& texts) {
  return testing_fixtures::run_greedy(engine, texts, kMaxNew);
}

struct Case {
  EagleKind kind;
  SpecParams params;
  int page_size;
  int batch;
  bool graphs = true;
};

// The GPU head keeps a bf16 KV cache and bf16 attention inputs: its probabilities sit within a
// few 1e-3 of the f32 reference's; the tree and the verification must still match exactly.
TEST(CudaSpeculative, HeadsMatchTheReferenceOnTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (EagleKind kind : {EagleKind::EAGLE, EagleKind::EAGLE3}) {
    SCOPED_TRACE(std::string(eagle_kind_name(kind)));
    spec_fixtures::check_golden(kind, Device::cuda(0), 5e-3f);
  }
}

TEST(CudaSpeculative, GreedyOutputEqualsTheTargetsOwn) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::string> texts;
  for (int i = 0; i < 16; ++i) texts.push_back(kTexts[static_cast<size_t>(i) % kTexts.size()]);
  std::map<int, std::vector<std::vector<int32_t>>> plain;  // by page size
  for (int page : {1, 16}) {
    Engine engine(kModel, gpu_options(page, 16));
    plain[page] = run(engine, texts);
  }
  const std::vector<Case> cases = {
      {EagleKind::EAGLE3, {5, 4, 8}, 16, 4},  {EagleKind::EAGLE3, {6, 8, 32}, 16, 16}, {EagleKind::EAGLE3, {3, 1, 4}, 1, 1},
      {EagleKind::EAGLE, {5, 4, 8}, 1, 8},    {EagleKind::EAGLE, {6, 1, 7}, 16, 16},   {EagleKind::EAGLE3, {1, 1, 2}, 16, 2},
      {EagleKind::EAGLE3, {5, 4, 8}, 16, 4, false}, {EagleKind::EAGLE, {3, 8, 16}, 1, 3, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(eagle_kind_name(c.kind)) + " (" + std::to_string(c.params.num_steps) + ", " +
                 std::to_string(c.params.topk) + ", " + std::to_string(c.params.num_draft_tokens) + ") page " +
                 std::to_string(c.page_size) + " batch " + std::to_string(c.batch));
    EngineOptions o = gpu_options(c.page_size, c.batch);
    o.runner.cuda_graph = c.graphs;
    o.speculative = EagleOptions{c.kind, spec_fixtures::head_dir(c.kind), c.params, SpecPolicyKind::FIXED};
    Engine engine(kModel, o);
    const int64_t free_at_start = engine.runner().allocator().available_size();
    const auto outs = run(engine, texts);
    for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(outs[i], plain[c.page_size][i]) << texts[i];
    const SchedulerStats s = engine.stats();
    EXPECT_GT(s.spec_cycles, 0);
    std::printf("%s (%d, %d, %d) page %d batch %d %s: mean accept length %.3f over %lld cycles\n",
                std::string(eagle_kind_name(c.kind)).c_str(), c.params.num_steps, c.params.topk,
                c.params.num_draft_tokens, c.page_size, c.batch, c.graphs ? "graphs" : "eager",
                static_cast<double>(s.spec_emitted_tokens) / static_cast<double>(s.spec_cycles),
                static_cast<long long>(s.spec_cycles));
    engine.flush_cache();
    EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
  }
}

// On the GPU a plain decode step attends through the decode kernel (tensor cores) and a verify row
// through the tree kernel (f32): their last bits differ, so where speculation mixes both (the auto
// policy's off steps between drafting cycles) a near-tie can go either way. The outputs must be
// equal up to their first difference, and there the two tokens must be a near-tie of the target's
// own distribution (scored by `scorer`, plain decoding).
constexpr float kNearTie = 0.05f;  // log-probability gap

void expect_equal_or_near_tie(Engine& scorer, const std::string& text, const std::vector<int32_t>& got,
                              const std::vector<int32_t>& want) {
  size_t j = 0;
  while (j < got.size() && j < want.size() && got[j] == want[j]) ++j;
  if (j == got.size() && j == want.size()) return;
  ASSERT_LT(j, std::min(got.size(), want.size())) << text << ": outputs of different lengths";
  EngineRequest r = testing_fixtures::greedy(text, static_cast<int>(j) + 1);
  r.logprobs = 5;
  auto h = scorer.submit(r);
  scorer.run_until_idle();
  const RequestOutput out = h->wait();
  ASSERT_EQ(out.output_ids.size(), j + 1);
  ASSERT_EQ(out.output_ids[j], want[j]) << text << ": the scorer does not reproduce the reference";
  const auto& top = out.logprobs[j].top;
  const auto other = std::find_if(top.begin(), top.end(), [&](const auto& e) { return e.first == got[j]; });
  ASSERT_NE(other, top.end()) << text << ": token " << got[j] << " at " << j << " is not among the target's top 5";
  EXPECT_LE(out.logprobs[j].logprob - other->second, kNearTie)
      << text << ": at " << j << " token " << got[j] << " has log-probability " << other->second << ", the target's "
      << want[j] << " " << out.logprobs[j].logprob;
  std::printf("near-tie at %zu of \"%.20s...\": %d (%.4f) vs %d (%.4f)\n", j, text.c_str(), got[j], other->second,
              want[j], out.logprobs[j].logprob);
}

// The auto policy's shapes on the GPU, forced through every transition (off steps as plain decode
// steps and the draft's catch-up after them, chains cut short through the loop graphs of each step
// count and the chain extends of each length, the full tree), then left to its own start-up
// calibration and measurements: the output is the GPU target's own greedy output but for
// near-ties (above), with bf16 and fp8 KV, graphs and eager, and every KV slot returns.
TEST(CudaSpeculative, AutoPolicyShapesKeepTheTargetsOwnOutput) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::string> texts;
  for (int i = 0; i < 12; ++i) texts.push_back(kTexts[static_cast<size_t>(i) % kTexts.size()]);
  struct AutoCase {
    SpecParams params;
    int page_size, batch;
    bool graphs, forced;
    DType kv;
  };
  const std::vector<AutoCase> cases = {
      {{7, 1, 8}, 16, 8, true, true, DType::bf16},   {{7, 1, 8}, 1, 1, true, true, DType::bf16},
      {{5, 4, 8}, 16, 8, true, true, DType::bf16},   {{6, 1, 7}, 16, 12, false, true, DType::bf16},
      {{7, 1, 8}, 16, 8, true, true, DType::fp8_e4m3}, {{7, 1, 8}, 16, 8, true, false, DType::bf16},
      {{5, 4, 8}, 1, 4, true, false, DType::bf16},
  };
  // The reference by page size and KV dtype: the GPU target's own greedy output; with an fp8
  // cache, the fixed policy's speculative output instead. Plain fp8 decoding attends through the
  // decode kernel, which multiplies the e4m3 keys and values in f16, while every verify row goes
  // through the tree kernel in f32: near-ties can round apart, so speculation with fp8 KV is
  // lossless against its own verify arithmetic, which every shape of the auto policy shares
  // exactly (deterministic mode: products and attention rows do not depend on their batch).
  std::map<std::pair<int, int>, std::vector<std::vector<int32_t>>> plain;
  for (const AutoCase& c : cases) {
    const std::pair<int, int> key{c.page_size, static_cast<int>(c.kv)};
    if (plain.count(key)) continue;
    EngineOptions o = gpu_options(c.page_size, 16);
    o.runner.kv_dtype = c.kv;
    if (c.kv == DType::fp8_e4m3) {
      o.speculative = EagleOptions{EagleKind::EAGLE3, spec_fixtures::head_dir(EagleKind::EAGLE3), c.params,
                                   SpecPolicyKind::FIXED};
    }
    Engine engine(kModel, o);
    plain[key] = run(engine, texts);
  }
  for (const AutoCase& c : cases) {
    SCOPED_TRACE("(" + std::to_string(c.params.num_steps) + ", " + std::to_string(c.params.topk) + ", " +
                 std::to_string(c.params.num_draft_tokens) + ") page " + std::to_string(c.page_size) + " batch " +
                 std::to_string(c.batch) + (c.graphs ? " graphs" : " eager") + (c.forced ? " forced" : " measured") +
                 " " + std::string(dtype_name(c.kv)));
    EngineOptions o = gpu_options(c.page_size, c.batch);
    o.runner.kv_dtype = c.kv;
    o.runner.cuda_graph = c.graphs;
    o.speculative = EagleOptions{EagleKind::EAGLE3, spec_fixtures::head_dir(EagleKind::EAGLE3), c.params,
                                 SpecPolicyKind::AUTO};
    Engine engine(kModel, o);
    SpecPolicy& policy = engine.speculative_worker()->policy();
    if (c.forced) {
      std::vector<SpecShape> sequence(static_cast<size_t>(c.params.num_draft_tokens) + 2, SpecShape{0, 1});
      for (const SpecShape& sh : policy.shapes()) {
        if (!sh.off()) sequence.insert(sequence.end(), {sh, SpecShape{0, 1}, sh, sh});
      }
      policy.force_sequence(sequence);
    }
    const int64_t free_at_start = engine.runner().allocator().available_size();
    const auto outs = run(engine, texts);
    const auto& reference = plain[std::make_pair(c.page_size, static_cast<int>(c.kv))];
    EngineOptions so = gpu_options(c.page_size, 1);
    so.runner.kv_dtype = c.kv;
    if (c.kv == DType::fp8_e4m3) {
      so.speculative = EagleOptions{EagleKind::EAGLE3, spec_fixtures::head_dir(EagleKind::EAGLE3), c.params,
                                    SpecPolicyKind::FIXED};
    }
    Engine scorer(kModel, so);
    for (size_t i = 0; i < texts.size(); ++i) expect_equal_or_near_tie(scorer, texts[i], outs[i], reference[i]);
    const SchedulerStats s = engine.stats();
    std::string choices;
    for (const auto& [bucket, shapes] : s.spec_choices) {
      for (const auto& [shape, n] : shapes) choices += " bs<=" + std::to_string(bucket) + ":" + shape + "x" + std::to_string(n);
    }
    std::printf("auto (%d, %d, %d) page %d batch %d %s %s %s: accept %.3f over %lld drafting cycles;%s\n",
                c.params.num_steps, c.params.topk, c.params.num_draft_tokens, c.page_size, c.batch,
                c.graphs ? "graphs" : "eager", c.forced ? "forced" : "measured", std::string(dtype_name(c.kv)).c_str(),
                s.spec_cycles > 0 ? static_cast<double>(s.spec_emitted_tokens) / static_cast<double>(s.spec_cycles) : 0.0,
                static_cast<long long>(s.spec_cycles), choices.c_str());
    engine.flush_cache();
    EXPECT_EQ(engine.runner().allocator().available_size(), free_at_start);
  }
}

TEST(CudaSpeculative, CopySlotsOnTheDeviceMatchesTheHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const KVPoolConfig host_config{64, 4, 2, 64, 64, DType::bf16, Device::cpu()};
  KVPoolConfig device_config = host_config;
  device_config.device = Device::cuda(0);
  MHAKVPool host(host_config), device(device_config);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> byte(0, 255);
  for (int l = 0; l < 4; ++l) {
    for (auto [h, d] : {std::pair{host.k_buffer(l), device.k_buffer(l)}, std::pair{host.v_buffer(l), device.v_buffer(l)}}) {
      for (size_t i = 0; i < h.nbytes(); ++i) static_cast<uint8_t*>(h.data())[i] = static_cast<uint8_t>(byte(rng));
      copy(d, h);
    }
  }
  // Chained moves: later moves write rows earlier ones read.
  const std::vector<int32_t> src = {9, 12, 13, 20}, dst = {8, 9, 10, 11};
  host.copy_slots(src, dst);
  device.copy_slots(src, dst, nullptr);
  for (int l = 0; l < 4; ++l) {
    for (auto [h, d] : {std::pair{host.k_buffer(l), device.k_buffer(l)}, std::pair{host.v_buffer(l), device.v_buffer(l)}}) {
      Buffer back(h.dtype(), h.shape());
      copy(back, d);
      EXPECT_EQ(std::memcmp(back.data(), h.data(), h.nbytes()), 0) << "layer " << l;
    }
  }
}

}  // namespace
}  // namespace specula
