// The GPU DeepSeek path (DeepseekCudaModel, the CUDA MLA backend at kv_lora_rank 512 / rope 64)
// on tiny random checkpoints: prompt logits against the float64 expanded-form reference and the
// CPU path, greedy tokens through the paged latent cache, bf16 and fp8_ds_mla caches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "specula/runtime/generator.h"
#include "tiny_deepseek.h"

namespace specula {
namespace {

struct GpuCase {
  std::string name;
  int q_lora = 0;
  bool yarn = false;
  DType kv_dtype = DType::bf16;
  int page_size = 64;
};

void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }

class CudaDeepseek : public ::testing::TestWithParam<GpuCase> {};

TEST_P(CudaDeepseek, MatchesTheReferenceAndTheCpuPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const GpuCase& p = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << p.name << " seed=" << seed);
  test::DeepseekShape shape;
  shape.arch = "DeepseekV3ForCausalLM";
  shape.hidden = 128;
  shape.heads = 16;
  shape.kv_lora = 512;
  shape.rope = 64;
  shape.nope = 32;
  shape.v = 32;
  shape.q_lora = p.q_lora;
  shape.yarn = p.yarn;
  const test::TinyDeepseek m = test::make_tiny_deepseek(shape, seed);
  const auto dir = std::filesystem::temp_directory_path() / ("specula_cuda_deepseek_" + std::to_string(seed));
  test::write_tiny_checkpoint(dir, test::deepseek_config(shape), m.weights);
  GeneratorOptions o;
  o.device = Device::cuda(0);
  o.page_size = p.page_size;
  o.kv_dtype = p.kv_dtype;
  Generator gpu(dir, o);
  GeneratorOptions co = o;
  co.device = Device::cpu();
  Generator cpu(dir, co);
  const MlaKVFormat format = p.kv_dtype == DType::fp8_e4m3 ? MlaKVFormat::fp8_ds_mla : MlaKVFormat::bf16;
  // The GPU rounds absorbed queries and attention outputs to bf16.
  const double tol = format == MlaKVFormat::bf16 ? 2e-2 : 4e-2;
  std::vector<int32_t> ids = gpu.tokenizer().encode("Multi-head latent attention on the GPU, 2 x 512 + 64 wide.");
  // A prompt longer than one 64-slot page and one 64-key tile.
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>(97 + i % 26));
  const std::vector<float> got = gpu.prompt_logits(ids);
  const std::vector<float> on_cpu = cpu.prompt_logits(ids);
  const std::vector<double> want = test::deepseek_reference_logits(m, format, ids);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(on_cpu.size(), want.size());
  double max_err = 0, max_cpu_diff = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    max_err = std::max(max_err, std::fabs(got[i] - want[i]));
    max_cpu_diff = std::max(max_cpu_diff, static_cast<double>(std::fabs(got[i] - on_cpu[i])));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  EXPECT_GT(max_abs, 0.5);
  EXPECT_LT(max_err, tol * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
  EXPECT_LT(max_cpu_diff, tol * std::max(1.0, max_abs)) << "max |logit| " << max_abs;

  GenerateRequest r;
  r.prompt_ids = ids;
  r.max_new_tokens = 8;
  r.ignore_eos = true;
  const auto out = gpu.generate(r).output_ids;
  ASSERT_EQ(out.size(), 8u);
  std::vector<int32_t> seq = ids;
  for (int32_t token : out) {
    const auto logits = test::deepseek_reference_logits(m, format, seq);
    std::vector<double> row(logits.end() - shape.vocab, logits.end());
    const auto best = std::max_element(row.begin(), row.end()) - row.begin();
    std::vector<double> sorted = row;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] > 2 * tol * std::max(1.0, max_abs)) EXPECT_EQ(token, best) << "step " << seq.size() - ids.size();
    seq.push_back(token);
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(All, CudaDeepseek,
                         ::testing::Values(GpuCase{"QProjBf16Page64"}, GpuCase{"QLoraYarnBf16Page1", 64, true, DType::bf16, 1},
                                           GpuCase{"QLoraFp8Page64", 64, false, DType::fp8_e4m3, 64},
                                           GpuCase{"YarnFp8Page16", 0, true, DType::fp8_e4m3, 16}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace specula
