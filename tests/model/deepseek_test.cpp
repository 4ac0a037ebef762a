// DeepSeek-V2/V3 (MLA, dense MLP) end to end on the CPU: tiny random checkpoints written in
// Hugging Face layout, run through the Generator (scheduler, paged latent cache, CPU MLA
// backend, absorbed attention) against the float64 expanded-form reference; plus the config's
// MLA fields and its clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "specula/core/error.h"
#include "specula/model/config.h"
#include "specula/runtime/generator.h"
#include "tiny_deepseek.h"

namespace specula {
namespace {

struct DsCase {
  std::string name;
  test::DeepseekShape shape;
  std::optional<DType> kv_dtype;  // unset: bf16
  int page_size = 4;
};

void PrintTo(const DsCase& c, std::ostream* os) { *os << c.name; }

class Deepseek : public ::testing::TestWithParam<DsCase> {};

TEST_P(Deepseek, MatchesTheFloat64ExpandedReference) {
  const DsCase& p = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << p.name << " seed=" << seed);
  const test::TinyDeepseek m = test::make_tiny_deepseek(p.shape, seed);
  const auto dir = std::filesystem::temp_directory_path() / ("specula_deepseek_" + std::to_string(seed));
  test::write_tiny_checkpoint(dir, test::deepseek_config(p.shape), m.weights);
  GeneratorOptions o;
  o.page_size = p.page_size;
  o.kv_dtype = p.kv_dtype;
  Generator gen(dir, o);
  const MlaKVFormat format = p.kv_dtype == DType::fp8_e4m3 ? MlaKVFormat::fp8_ds_mla : MlaKVFormat::bf16;
  // fp8 rounds a latent value by up to 1/16 of its tile's scale; a double-vs-float difference can
  // round one value the other way, so its tolerance is wider.
  const double tol = format == MlaKVFormat::bf16 ? 2e-3 : 2e-2;
  const std::vector<int32_t> ids = gen.tokenizer().encode("Latent attention, absorbed: 42 keys & values!");
  const std::vector<float> got = gen.prompt_logits(ids);
  const std::vector<double> want = test::deepseek_reference_logits(m, format, ids);
  ASSERT_EQ(got.size(), want.size());
  const test::LogitError err = test::logit_error(got, want);
  const double max_err = err.max_err, max_abs = err.max_abs;
  ASSERT_TRUE(err.finite);
  EXPECT_GT(max_abs, 0.5);
  EXPECT_LT(max_err, tol * std::max(1.0, max_abs)) << "max |logit| " << max_abs;

  // Greedy decoding through the paged latent cache picks the reference's argmax wherever that is clear.
  const test::GreedyCheck check = test::decode_and_check(gen, m, format, ids, 10, err);
  EXPECT_GT(check.checked, 0);
  EXPECT_TRUE(check.mismatches.empty()) << check.mismatches.front();
  std::filesystem::remove_all(dir);
}

test::DeepseekShape shape(auto&& edit) {
  test::DeepseekShape s;
  edit(s);
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    All, Deepseek,
    ::testing::Values(DsCase{"V2QProj", shape([](auto&) {}), std::nullopt},
                      DsCase{"V2QLoraYarn", shape([](auto& s) {
                               s.q_lora = 48;
                               s.yarn = true;
                             }), std::nullopt},
                      DsCase{"V3HalvesRopePage1", shape([](auto& s) {
                               s.arch = "DeepseekV3ForCausalLM";
                               s.q_lora = 40;
                               s.interleave = false;
                             }), std::nullopt, 1},
                      DsCase{"V3Fp8Rank128", shape([](auto& s) {
                               s.arch = "DeepseekV3ForCausalLM";
                               s.kv_lora = 128;
                               s.yarn = true;
                             }), DType::fp8_e4m3, 64}),
    [](const auto& info) { return info.param.name; });

nlohmann::json small_config() { return test::deepseek_config(test::DeepseekShape{}); }

TEST(DeepseekConfig, ReadsTheMlaFieldsAndTheScale) {
  nlohmann::json j = small_config();
  j["q_lora_rank"] = 48;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 64},
                       {"mscale", 0.707}, {"mscale_all_dim", 0.707}};
  const ModelConfig c = parse_model_config(j.dump());
  ASSERT_TRUE(c.is_mla());
  EXPECT_EQ(c.mla.q_lora_rank, 48);
  EXPECT_EQ(c.mla.kv_lora_rank, 64);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 32);
  EXPECT_EQ(c.mla.qk_rope_head_dim, 16);
  EXPECT_EQ(c.mla.v_head_dim, 24);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.mla.rope_interleave);
  const double mscale = 0.0707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.mla.softmax_scale, mscale * mscale / std::sqrt(48.0), 1e-12);
  j.erase("rope_scaling");
  EXPECT_NEAR(parse_model_config(j.dump()).mla.softmax_scale, 1.0 / std::sqrt(48.0), 1e-12);
}

TEST(DeepseekConfig, MixtureOfExpertsLayersAreAClearError) {
  nlohmann::json j = small_config();
  j["n_routed_experts"] = 8;
  j["first_k_dense_replace"] = 1;
  try {
    parse_model_config(j.dump());
    FAIL() << "a config with MoE layers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 is a mixture-of-experts layer"), std::string::npos) << e.what();
  }
  // Every layer dense (first_k_dense_replace covers them all): accepted.
  j["first_k_dense_replace"] = 2;
  EXPECT_TRUE(parse_model_config(j.dump()).is_mla());
  auto expect_error = [](const nlohmann::json& bad, const std::string& says) {
    try {
      parse_model_config(bad.dump());
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  nlohmann::json bad = j;
  bad["attention_bias"] = true;
  expect_error(bad, "attention_bias is not supported");
  bad = j;
  bad["hidden_act"] = "gelu_pytorch_tanh";
  expect_error(bad, "activation 'gelu_pytorch_tanh' is not supported for DeepseekV2ForCausalLM");
  bad = j;
  bad["quantization_config"] = {{"quant_method", "fp8"}};
  expect_error(bad, "quantized checkpoints (quantization_config) are not supported");
}

TEST(DeepseekConfig, OptionsMlaCannotServeAreClearErrors) {
  const uint32_t seed = std::random_device{}();
  const test::TinyDeepseek m = test::make_tiny_deepseek(test::DeepseekShape{}, seed);
  const auto dir = std::filesystem::temp_directory_path() / ("specula_deepseek_dtype_" + std::to_string(seed));
  test::write_tiny_checkpoint(dir, test::deepseek_config(m.shape), m.weights);
  GeneratorOptions o;
  o.kv_dtype = DType::f16;
  try {
    Generator gen(dir, o);
    ADD_FAILURE() << "an f16 latent cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use bf16 or fp8_e4m3"), std::string::npos) << e.what();
  }
  GeneratorOptions det;
  det.deterministic = true;
  try {
    Generator gen(dir, det);
    ADD_FAILURE() << "deterministic mode was accepted for an MLA model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deterministic inference is not available"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specula
