// The GPU DeepSeek path (DeepseekCudaModel, the CUDA MLA backend at kv_lora_rank 512 / rope 64)
// on tiny random checkpoints: prompt logits against the float64 expanded-form reference and the
// CPU path, greedy tokens through the paged latent cache, bf16 and fp8_ds_mla caches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "specula/core/error.h"
#include "specula/model/config.h"
#include "specula/model/cuda_models.h"
#include "specula/model/synthetic.h"
#include "specula/runtime/engine.h"
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
  bool interleave = true;  // rope_interleave
  int nope_v = 32;          // qk_nope_head_dim and v_head_dim: 128 prefills in the expanded form
};

// The widths the CUDA MLA backend serves (kv_lora_rank 512, rope 64), small elsewhere.
test::DeepseekShape gpu_shape() {
  test::DeepseekShape s;
  s.arch = "DeepseekV3ForCausalLM";
  s.hidden = 128;
  s.heads = 16;
  s.kv_lora = 512;
  s.rope = 64;
  s.nope = 32;
  s.v = 32;
  return s;
}

void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }

class CudaDeepseek : public ::testing::TestWithParam<GpuCase> {};

TEST_P(CudaDeepseek, MatchesTheReferenceAndTheCpuPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const GpuCase& p = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << p.name << " seed=" << seed);
  test::DeepseekShape shape = gpu_shape();
  shape.q_lora = p.q_lora;
  shape.yarn = p.yarn;
  shape.interleave = p.interleave;
  shape.nope = shape.v = p.nope_v;
  const test::TinyDeepseek m = test::make_tiny_deepseek(shape, seed);
  const auto dir = std::filesystem::temp_directory_path() / ("specula_cuda_deepseek_" + std::to_string(seed));
  test::write_tiny_checkpoint(dir, test::deepseek_config(shape), m.weights);
  GeneratorOptions o;
  o.device = Device::cuda(0);
  o.page_size = p.page_size;
  o.kv_dtype = p.kv_dtype;
  // Forced, so the case cannot pass through the absorbed form unnoticed; decode stays absorbed.
  if (p.nope_v == 128) o.mla_extend_form = MlaExtendForm::expanded;
  Generator gpu(dir, o);
  GeneratorOptions co = o;
  co.device = Device::cpu();
  co.mla_extend_form = MlaExtendForm::automatic;
  Generator cpu(dir, co);
  const MlaKVFormat format = p.kv_dtype == DType::fp8_e4m3 ? MlaKVFormat::fp8_ds_mla : MlaKVFormat::bf16;
  // The GPU rounds absorbed queries and attention outputs to bf16.
  const double tol = format == MlaKVFormat::bf16 ? 3e-2 : 6e-2;
  std::vector<int32_t> ids = gpu.tokenizer().encode("Multi-head latent attention on the GPU, 2 x 512 + 64 wide.");
  // A prompt longer than one 64-slot page and one 64-key tile.
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>(97 + i % 26));
  const std::vector<float> got = gpu.prompt_logits(ids);
  const std::vector<float> on_cpu = cpu.prompt_logits(ids);
  const std::vector<double> want = test::deepseek_reference_logits(m, format, ids);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(on_cpu.size(), want.size());
  const test::LogitError err = test::logit_error(got, want);
  const double max_err = err.max_err, max_abs = err.max_abs;
  ASSERT_TRUE(err.finite);
  const double max_cpu_diff = test::logit_error(got, std::vector<double>(on_cpu.begin(), on_cpu.end())).max_err;
  EXPECT_GT(max_abs, 0.5);
  EXPECT_LT(max_err, tol * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
  EXPECT_LT(max_cpu_diff, tol * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
  std::printf("%s: max |logit| %.3f, max error vs float64 %.2e, vs the CPU path %.2e\n", p.name.c_str(), max_abs,
              max_err, max_cpu_diff);

  // Greedy decoding through the paged latent cache picks the reference's argmax wherever that is clear.
  const test::GreedyCheck check = test::decode_and_check(gpu, m, format, ids, 16, err);
  // A token is checked where the reference's top two logits are 4 prompt errors apart. Some seeds
  // give an fp8 cache a prompt error near 0.4 (within tol): then hardly any token is that clear,
  // and only those few are checked (the CPU path's logits above bound the GPU's all the same).
  if (4 * max_err < 0.1 * max_abs) {
    EXPECT_GT(check.checked, 0);
  }
  EXPECT_TRUE(check.mismatches.empty()) << check.mismatches.front();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(All, CudaDeepseek,
                         ::testing::Values(GpuCase{"QProjBf16Page64"}, GpuCase{"QLoraYarnBf16Page1", 64, true, DType::bf16, 1},
                                           GpuCase{"QLoraFp8Page64", 64, false, DType::fp8_e4m3, 64},
                                           GpuCase{"YarnFp8Page16", 0, true, DType::fp8_e4m3, 16},
                                           GpuCase{"HalvesRopeBf16Page16", 64, false, DType::bf16, 16, false},
                                           GpuCase{"ExpandedPrefillBf16Page64", 0, true, DType::bf16, 64, true, 128},
                                           GpuCase{"ExpandedPrefillQLoraFp8Page16", 64, false, DType::fp8_e4m3, 16, true,
                                                   128}),
                         [](const auto& info) { return info.param.name; });

// Several requests decoding together through captured graphs (5 requests run in the graph of 8,
// with 3 padding rows), each against the reference.
TEST(CudaDeepseekEngine, BatchedGraphDecodeMatchesTheReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  test::DeepseekShape shape = gpu_shape();
  shape.q_lora = 64;
  const test::TinyDeepseek m = test::make_tiny_deepseek(shape, seed);
  const auto dir = std::filesystem::temp_directory_path() / ("specula_cuda_deepseek_batch_" + std::to_string(seed));
  test::write_tiny_checkpoint(dir, test::deepseek_config(shape), m.weights);
  EngineOptions o;
  o.background_thread = false;
  o.runner.device = Device::cuda(0);
  o.runner.page_size = 16;
  o.runner.max_context_len = 128;
  o.runner.max_running_requests = 8;
  o.runner.cuda_graph_batch_sizes = {1, 2, 4, 8};
  Engine engine(dir, o);
  ASSERT_EQ(engine.runner().cuda_graph_batch_sizes(), std::vector<int>({1, 2, 4, 8}));
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int len : {3, 17, 40, 9, 66}) {
    std::vector<int32_t> ids;
    for (int i = 0; i < len; ++i) ids.push_back(static_cast<int32_t>(rng() % 256));
    EngineRequest r;
    r.prompt_ids = ids;
    r.max_new_tokens = 8;
    r.ignore_eos = true;
    prompts.push_back(ids);
    handles.push_back(engine.submit(r));
  }
  engine.run_until_idle();
  int checked = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestOutput out = handles[i]->wait();
    ASSERT_EQ(out.output_ids.size(), 8u);
    const test::GreedyCheck check = test::check_greedy(m, MlaKVFormat::bf16, prompts[i], out.output_ids, 0.4);
    EXPECT_TRUE(check.mismatches.empty()) << "request " << i << ": " << check.mismatches.front();
    checked += check.checked;
  }
  EXPECT_GT(checked, 5);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

struct MoeCase {
  std::string name;
  std::string method = "greedy";
  int experts = 8, top_k = 2, shared = 1, n_group = 1, topk_group = 1;
  bool norm = false;
  double scaling = 1.0;
  int fp8_block = 0;  // > 0: the checkpoint in DeepSeek-V3's fp8 layout with these blocks
};

void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

class CudaDeepseekMoe : public ::testing::TestWithParam<MoeCase> {};

// DeepSeek models with mixture-of-experts layers on the GPU (CudaMoe; experts read from the
// checkpoint without an f32 host copy): prompt logits against the float64 reference and the CPU
// path, then greedy decoding through captured graphs. The GPU's bf16 queries, attention outputs
// and experts (the checkpoint is f32) move the logits by ~1% of their scale, and an MoE layer's
// router logits likewise: a token routed within that of a tie may take another expert, which
// changes its output by O(1). So a model whose prompt routes within `clear` of a tie (logit gaps
// for softmax scores, score gaps for sigmoid ones) is drawn again, and decode steps that close
// are not checked.
TEST_P(CudaDeepseekMoe, MatchesTheReferenceAndTheCpuPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const MoeCase& c = GetParam();
  // (Softmax gaps of 0.15 were not enough: model seed 3315434305, clear by 0.15, left the GPU 0.45
  // from float64 where the CPU path was 0.014 from it.)
  const double clear = c.method == "noaux_tc" ? 3e-2 : 0.3;
  test::DeepseekShape shape = gpu_shape();
  shape.q_lora = 64;
  shape.layers = 3;
  shape.first_dense = 2;  // one MoE layer: fewer routings that must all be clear
  shape.experts = c.experts;
  shape.top_k = c.top_k;
  shape.shared = c.shared;
  shape.n_group = c.n_group;
  shape.topk_group = c.topk_group;
  shape.topk_method = c.method;
  shape.norm_topk = c.norm;
  shape.scaling = c.scaling;
  shape.moe_inter = 48;
  shape.arch = c.method == "noaux_tc" ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM";
  // The first model's seed: SPECULA_TEST_SEED repeats a run (the trace below prints the seed used).
  const char* env_seed = std::getenv("SPECULA_TEST_SEED");
  uint32_t seed =
      env_seed != nullptr ? static_cast<uint32_t>(std::strtoul(env_seed, nullptr, 10)) : std::random_device{}();
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(static_cast<int32_t>(32 + (i * 37) % 200));
  test::TinyDeepseek m;
  double routing = 0;
  for (int attempt = 0; attempt < 200 && routing < clear; ++attempt, ++seed) {
    m = test::make_tiny_deepseek(shape, seed);
    if (c.fp8_block > 0) test::quantize_deepseek_fp8(m, c.fp8_block);
    routing = INFINITY;
    test::deepseek_reference_logits(m, MlaKVFormat::bf16, ids, &routing);
  }
  ASSERT_GE(routing, clear) << "no model in 200 draws routes the prompt clear of ties";
  SCOPED_TRACE(::testing::Message() << c.name << " seed=" << seed - 1);
  const auto dir = std::filesystem::temp_directory_path() / ("specula_cuda_moe_" + std::to_string(seed));
  nlohmann::json config = test::deepseek_config(shape);
  if (c.fp8_block > 0) test::add_fp8_quantization_config(config, c.fp8_block);
  test::write_tiny_checkpoint(dir, config, m.weights);
  GeneratorOptions o;
  o.device = Device::cuda(0);
  o.page_size = 16;
  o.fp8_experts = c.fp8_block > 0;
  Generator gpu(dir, o);
  GeneratorOptions co = o;
  co.device = Device::cpu();
  Generator cpu(dir, co);
  const std::vector<float> got = gpu.prompt_logits(ids);
  const std::vector<float> on_cpu = cpu.prompt_logits(ids);
  const std::vector<double> want = test::deepseek_reference_logits(m, MlaKVFormat::bf16, ids);
  ASSERT_EQ(got.size(), want.size());
  const test::LogitError err = test::logit_error(got, want);
  ASSERT_TRUE(err.finite);
  const double cpu_diff = test::logit_error(got, std::vector<double>(on_cpu.begin(), on_cpu.end())).max_err;
  EXPECT_GT(err.max_abs, 0.5);
  // bf16 queries (the dense cases' 3e-2) and bf16 experts: the GPU rounds the f32 checkpoint's
  // experts to bf16, where its dense matrices stay f32 (seen: 3.2e-2).
  EXPECT_LT(err.max_err, 4.5e-2 * std::max(1.0, err.max_abs)) << "max |logit| " << err.max_abs;
  EXPECT_LT(cpu_diff, 4.5e-2 * std::max(1.0, err.max_abs));
  std::printf("%s: max |logit| %.3f, max error vs float64 %.2e, vs the CPU path %.2e (the CPU path vs float64 %.2e)\n",
              c.name.c_str(), err.max_abs, err.max_err, cpu_diff, test::logit_error(on_cpu, want).max_err);
  const test::GreedyCheck check = test::decode_and_check(gpu, m, MlaKVFormat::bf16, ids, 12, err, clear);
  EXPECT_TRUE(check.mismatches.empty()) << check.mismatches.front();
  std::printf("%s: %d greedy steps checked\n", c.name.c_str(), check.checked);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(All, CudaDeepseekMoe,
                         ::testing::Values(MoeCase{"V2SoftmaxGreedy"},
                                           MoeCase{"V2GroupLimited", "group_limited_greedy", 8, 2, 2, 4, 2, false, 1.0},
                                           MoeCase{"V3SigmoidNoauxTc", "noaux_tc", 16, 4, 1, 4, 2, true, 2.5},
                                           MoeCase{"V3Fp8Blocks", "noaux_tc", 16, 4, 1, 4, 2, true, 2.5, 32}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace specula
