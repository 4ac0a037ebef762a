// The GPU execution path of the decoder against the CPU one and the PyTorch golden fixtures.
// Built in CUDA builds; skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "specula/runtime/generator.h"
#include "specula/runner/sampler.h"

namespace specula {
namespace {

const std::filesystem::path kSource = SPECULA_SOURCE_DIR;

TEST(CudaModel, ShippedModelMatchesCpuAndGreedyReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::ifstream in(kSource / "tests/data/model_pair/target.json");
  const nlohmann::json fixture = nlohmann::json::parse(in);
  GeneratorOptions cpu_options;
  Generator cpu(kSource / "models/specula-byte-6m", cpu_options);
  for (int page : {1, 16, 64}) {
    GeneratorOptions o;
    o.device = Device::cuda(0);
    o.page_size = page;
    Generator gpu(kSource / "models/specula-byte-6m", o);
    for (const auto& p : fixture["prompts"]) {
      const auto ids = p["ids"].get<std::vector<int32_t>>();
      SCOPED_TRACE(::testing::Message() << p["prompt"].get<std::string>() << " page " << page);
      const std::vector<float> a = cpu.prompt_logits(ids);
      const std::vector<float> b = gpu.prompt_logits(ids);
      ASSERT_EQ(a.size(), b.size());
      double max_diff = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(b[i])) << i;
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
      }
      // bf16 q/k/v and KV cache on the GPU: logits within a few hundredths of the f32 CPU path.
      EXPECT_LT(max_diff, 0.1);
      // The greedy ids found on the device are the host's greedy pick over the same logits.
      const std::vector<int32_t> greedy = gpu.prompt_greedy_ids(ids);
      const size_t vocab = b.size() / ids.size();
      ASSERT_EQ(greedy.size(), ids.size());
      for (size_t t = 0; t < ids.size(); ++t) {
        EXPECT_EQ(greedy[t], greedy_token({b.data() + t * vocab, vocab})) << "position " << t;
      }
      const std::vector<int32_t> cpu_greedy = cpu.prompt_greedy_ids(ids);
      ASSERT_EQ(cpu_greedy.size(), ids.size());
      for (size_t t = 0; t < ids.size(); ++t) {
        EXPECT_EQ(cpu_greedy[t], greedy_token({a.data() + t * vocab, vocab})) << "CPU, position " << t;
      }
      // Greedy tokens equal the reference wherever its top-2 margin is comfortable.
      const auto margins = p["greedy_margins"].get<std::vector<double>>();
      const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
      size_t safe = 0;
      while (safe < margins.size() && margins[safe] > 0.1) ++safe;
      GenerateRequest r;
      r.prompt_ids = ids;
      r.max_new_tokens = static_cast<int>(safe);
      r.ignore_eos = true;
      const auto out = gpu.generate(r).output_ids;
      ASSERT_EQ(out.size(), safe);
      for (size_t i = 0; i < safe; ++i) ASSERT_EQ(out[i], expected[i]) << "step " << i;
    }
  }
}

}  // namespace
}  // namespace specula
