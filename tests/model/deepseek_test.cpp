// DeepSeek-V2/V3 (MLA, dense and mixture-of-experts MLPs) end to end on the CPU: tiny random checkpoints written in
// Hugging Face layout, run through the Generator (scheduler, paged latent cache, CPU MLA
// backend, absorbed attention) against the float64 expanded-form reference; plus the config's
// MLA fields and its clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>

#include "specula/core/error.h"
#include "specula/model/config.h"
#include "specula/model/fp8_weights.h"
#include "specula/model/safetensors.h"
#include "specula/model/tokenizer.h"
#include "specula/model/moe.h"
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

// Logit error allowed, relative to the logits' scale, against the reference with a bf16 latent
// cache. The model (float) and the reference (double) round the cached latent to bf16 alike, except
// where a value lies within their difference of a rounding boundary: it then lands on the other
// neighbour. Typical runs are within 1% of 2e-3; one such flip moved the logits by 2.1e-3 of their
// scale (V2QLoraYarn, seed 89402825), so the tolerance keeps room for a few. Real faults (a wrong
// rotation, scale or cache row) are orders of magnitude larger.
constexpr double kBf16LatentTolerance = 5e-3;

TEST_P(Deepseek, MatchesTheFloat64ExpandedReference) {
  const DsCase& p = GetParam();
  // Fresh weights, redrawn (a few times at most) while a token's routing is within rounding of
  // another expert's: the model and the reference could then route it differently.
  uint32_t seed = std::random_device{}();
  const std::string text = "Latent attention, absorbed: 42 keys & values!";
  const std::vector<int32_t> prompt =
      Tokenizer::from_folder(std::filesystem::path(SPECULA_SOURCE_DIR) / "models" / "specula-byte-6m").encode(text);
  test::TinyDeepseek m = test::make_tiny_deepseek(p.shape, seed);
  for (int retry = 0; retry < 8 && p.shape.experts > 0; ++retry) {
    double margin = INFINITY;
    test::deepseek_reference_logits(m, MlaKVFormat::bf16, prompt, &margin);
    if (margin > test::kRoutingMargin) break;
    m = test::make_tiny_deepseek(p.shape, ++seed);
  }
  SCOPED_TRACE(::testing::Message() << p.name << " seed=" << seed);
  const auto dir = std::filesystem::temp_directory_path() / ("specula_deepseek_" + std::to_string(seed));
  test::write_tiny_checkpoint(dir, test::deepseek_config(p.shape), m.weights);
  GeneratorOptions o;
  o.page_size = p.page_size;
  o.kv_dtype = p.kv_dtype;
  Generator gen(dir, o);
  const MlaKVFormat format = p.kv_dtype == DType::fp8_e4m3 ? MlaKVFormat::fp8_ds_mla : MlaKVFormat::bf16;
  // fp8 rounds a latent value by up to 1/16 of its tile's scale, hence its width.
  const double tol = format == MlaKVFormat::bf16 ? kBf16LatentTolerance : 2e-2;
  const std::vector<int32_t> ids = gen.tokenizer().encode(text);
  const std::vector<float> got = gen.prompt_logits(ids);
  double routing = INFINITY;
  const std::vector<double> want = test::deepseek_reference_logits(m, format, ids, &routing);
  ASSERT_EQ(got.size(), want.size());
  if (routing < test::kRoutingMargin) GTEST_SKIP() << "a routing tie within rounding (" << routing << "); seed " << seed;
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
                             }), DType::fp8_e4m3, 64},
                      DsCase{"V2MoeGreedyScaled", shape([](auto& s) {
                               s.experts = 8;
                               s.scaling = 16.0;  // DeepSeek-V2's
                             }), std::nullopt},
                      DsCase{"V2MoeGroupLimitedNormalised", shape([](auto& s) {
                               s.experts = 8;
                               s.top_k = 3;
                               s.n_group = 4;
                               s.topk_group = 2;
                               s.topk_method = "group_limited_greedy";
                               s.norm_topk = true;
                               s.scaling = 2.5;
                               s.shared = 0;
                             }), std::nullopt},
                      DsCase{"V3MoeNoAuxTc", shape([](auto& s) {
                               s.arch = "DeepseekV3ForCausalLM";
                               s.q_lora = 40;
                               s.experts = 8;
                               s.top_k = 2;
                               s.n_group = 4;
                               s.topk_group = 2;
                               s.topk_method = "noaux_tc";
                               s.norm_topk = true;
                               s.scaling = 2.5;
                               s.shared = 2;
                               s.first_dense = 0;
                             }), std::nullopt, 16}),
    [](const auto& info) { return info.param.name; });

nlohmann::json small_config() { return test::deepseek_config(test::DeepseekShape{}); }

// DeepSeek-V3's published fp8 layout (e4m3 projections with block scales, here 32 x 32 over
// matrices that are not multiples of it): the loader dequantizes each matrix to bf16 exactly as
// the test decodes and rounds it, and the model (MoE layers, noaux_tc routing) matches the float64 reference over the
// dequantized weights.
TEST(DeepseekFp8, BlockScaledCheckpointMatchesTheReference) {
  test::DeepseekShape shape;
  shape.arch = "DeepseekV3ForCausalLM";
  shape.q_lora = 48;
  shape.experts = 8;
  shape.top_k = 2;
  shape.n_group = 4;
  shape.topk_group = 2;
  shape.topk_method = "noaux_tc";
  shape.norm_topk = true;
  shape.scaling = 2.5;
  constexpr int kBlock = 32;
  const std::string text = "fp8 blocks, dequantized on load.";
  const std::vector<int32_t> prompt =
      Tokenizer::from_folder(std::filesystem::path(SPECULA_SOURCE_DIR) / "models" / "specula-byte-6m").encode(text);
  uint32_t seed = std::random_device{}();
  test::TinyDeepseek m;
  double margin = 0;
  for (int retry = 0; retry < 20 && margin <= test::kRoutingMargin; ++retry, ++seed) {
    m = test::make_tiny_deepseek(shape, seed);
    test::quantize_deepseek_fp8(m, kBlock);
    margin = INFINITY;
    test::deepseek_reference_logits(m, MlaKVFormat::bf16, prompt, &margin);
  }
  ASSERT_GT(margin, test::kRoutingMargin);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed - 1);
  ASSERT_FALSE(m.weights.fp8_codes.empty());
  const auto dir = std::filesystem::temp_directory_path() / ("specula_deepseek_fp8_" + std::to_string(seed));
  nlohmann::json config = test::deepseek_config(shape);
  test::add_fp8_quantization_config(config, kBlock);
  test::write_tiny_checkpoint(dir, config, m.weights);
  {
    const Checkpoint ckpt(dir);
    const ModelConfig c = load_model_config(dir);
    const Fp8BlockWeights weights(ckpt, c);
    for (const auto& [name, codes] : m.weights.fp8_codes) {
      const std::vector<int64_t>& dims = m.weights.shapes.at(name);
      ASSERT_EQ(ckpt.get(name, Shape(dims)).dtype(), DType::fp8_e4m3) << name;
      const TensorView t = weights.get(name, Shape(dims));
      ASSERT_EQ(t.dtype(), DType::bf16);
      const std::vector<float>& want = m.weights.at(name);
      const auto* bits = static_cast<const uint16_t*>(t.data());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16), want[i]) << name << " " << i;
      }
    }
  }
  Generator gen(dir, GeneratorOptions{});
  // A decode step reads 2 of the 8 experts of the one MoE layer (f32 on the CPU).
  EXPECT_EQ(gen.runner().weight_bytes() - gen.runner().decode_weight_bytes(),
            size_t{6} * 3 * static_cast<size_t>(shape.hidden) * static_cast<size_t>(shape.moe_inter) * sizeof(float));
  const std::vector<float> got = gen.prompt_logits(prompt);
  const std::vector<double> want = test::deepseek_reference_logits(m, MlaKVFormat::bf16, prompt);
  const test::LogitError err = test::logit_error(got, want);
  ASSERT_TRUE(err.finite);
  EXPECT_GT(err.max_abs, 0.5);
  EXPECT_LT(err.max_err, kBf16LatentTolerance * std::max(1.0, err.max_abs)) << "max |logit| " << err.max_abs;
  const test::GreedyCheck check = test::decode_and_check(gen, m, MlaKVFormat::bf16, prompt, 8, err);
  EXPECT_TRUE(check.mismatches.empty()) << check.mismatches.front();
  std::filesystem::remove_all(dir);
}

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

TEST(DeepseekConfig, ReadsTheMixtureOfExpertsFields) {
  nlohmann::json j = small_config();
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 3;
  j["n_shared_experts"] = 2;
  j["first_k_dense_replace"] = 1;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["topk_method"] = "group_limited_greedy";
  j["routed_scaling_factor"] = 16.0;
  const ModelConfig c = parse_model_config(j.dump());
  ASSERT_TRUE(c.has_moe());
  EXPECT_EQ(c.moe.n_routed_experts, 8);
  EXPECT_EQ(c.moe.num_experts_per_tok, 3);
  EXPECT_EQ(c.moe.n_shared_experts, 2);
  EXPECT_EQ(c.moe.moe_intermediate_size, 32);
  EXPECT_EQ(c.moe.topk_method, MoeConfig::TopK::kGroupLimited);
  EXPECT_FALSE(c.moe.sigmoid);
  EXPECT_FALSE(c.moe.scale_always);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 16.0);
  EXPECT_FALSE(c.moe.is_moe_layer(0));
  EXPECT_TRUE(c.moe.is_moe_layer(1));
  // V3's defaults: sigmoid scores, noaux_tc, the scaling factor always applied.
  nlohmann::json v3 = j;
  v3["architectures"] = {"DeepseekV3ForCausalLM"};
  v3.erase("topk_method");
  const ModelConfig c3 = parse_model_config(v3.dump());
  EXPECT_TRUE(c3.moe.sigmoid);
  EXPECT_EQ(c3.moe.topk_method, MoeConfig::TopK::kNoAuxTc);
  EXPECT_TRUE(c3.moe.scale_always);
  // Without routed experts every layer is dense.
  j["n_routed_experts"] = nullptr;
  EXPECT_FALSE(parse_model_config(j.dump()).has_moe());
}

// Which layers are mixtures of experts: DeepSeek's first_k_dense_replace and moe_layer_freq,
// Qwen3-MoE's decoder_sparse_step ((l + 1) % step) and mlp_only_layers, Mixtral's every layer.
TEST(MoeConfig, TheLayerMapFollowsEachFamilysFields) {
  auto moe_layers = [](const ModelConfig& c) {
    std::vector<int> out;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      if (c.moe.is_moe_layer(l)) out.push_back(l);
    }
    return out;
  };
  nlohmann::json j = small_config();
  j["num_hidden_layers"] = 5;
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["first_k_dense_replace"] = 1;
  j["moe_layer_freq"] = 2;
  EXPECT_EQ(moe_layers(parse_model_config(j.dump())), (std::vector<int>{2, 4}));
  const nlohmann::json qwen = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 64},
                               {"intermediate_size", 128}, {"num_hidden_layers", 6}, {"num_attention_heads", 4},
                               {"num_key_value_heads", 2}, {"head_dim", 16}, {"num_experts", 8},
                               {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32}, {"decoder_sparse_step", 2},
                               {"mlp_only_layers", {3}}};
  const ModelConfig q = parse_model_config(qwen.dump());
  EXPECT_EQ(moe_layers(q), (std::vector<int>{1, 5}));
  EXPECT_TRUE(q.qk_norm);
  EXPECT_FALSE(q.moe.norm_topk_prob);
  nlohmann::json mixtral = qwen;
  mixtral["architectures"] = {"MixtralForCausalLM"};
  mixtral.erase("num_experts");
  mixtral["num_local_experts"] = 4;
  const ModelConfig x = parse_model_config(mixtral.dump());
  EXPECT_EQ(moe_layers(x), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(x.moe.norm_topk_prob);
  EXPECT_TRUE(x.moe.mixtral_names);
  EXPECT_EQ(x.moe.moe_intermediate_size, 128);
  EXPECT_EQ(x.layer_sliding_window[0], -1);
  mixtral["sliding_window"] = 64;
  EXPECT_EQ(parse_model_config(mixtral.dump()).layer_sliding_window[5], 64);
  nlohmann::json gelu = qwen;
  gelu["hidden_act"] = "gelu_pytorch_tanh";
  try {
    parse_model_config(gelu.dump());
    ADD_FAILURE() << "experts with a GeLU gate were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation 'gelu_pytorch_tanh' is not supported for Qwen3MoeForCausalLM's experts"),
              std::string::npos)
        << e.what();
  }
}

TEST(DeepseekConfig, BadFieldsAreClearErrors) {
  const nlohmann::json j = small_config();
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
  bad["quantization_config"] = {{"quant_method", "gptq"}};
  expect_error(bad, "quantization_config quant_method 'gptq' is not supported; supported: fp8");
  bad["quantization_config"] = {{"quant_method", "fp8"}};
  expect_error(bad, "quantization_config needs weight_block_size");
  bad["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}};
  expect_error(bad, "fmt 'e5m2' is not supported; supported: e4m3");
  bad["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "static"}, {"weight_block_size", {128, 128}}};
  expect_error(bad, "activation_scheme 'static' is not supported; supported: dynamic");
  bad["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128}}};
  expect_error(bad, "must be [rows, columns]");
  bad = j;
  test::add_fp8_quantization_config(bad, 128);
  const ModelConfig fp8 = parse_model_config(bad.dump());
  EXPECT_EQ(fp8.fp8_block_out, 128);
  EXPECT_EQ(fp8.fp8_block_in, 128);
  nlohmann::json moe = j;
  moe["n_routed_experts"] = 8;
  moe["num_experts_per_tok"] = 2;
  bad = moe;
  bad["num_experts_per_tok"] = 9;
  expect_error(bad, "num_experts_per_tok");
  bad = moe;
  bad["n_group"] = 3;
  expect_error(bad, "n_group 3 does not divide n_routed_experts 8");
  bad = moe;
  bad["n_group"] = 4;
  bad["topk_group"] = 5;
  expect_error(bad, "topk_group");
  bad = moe;
  bad["topk_method"] = "random";
  expect_error(bad, "topk_method 'random' is not supported; supported: greedy, group_limited_greedy, noaux_tc");
  bad = moe;
  bad["scoring_func"] = "relu";
  expect_error(bad, "scoring_func 'relu' is not supported");
  bad = moe;
  bad["n_group"] = 8;
  bad["topk_group"] = 1;
  bad["topk_method"] = "noaux_tc";
  expect_error(bad, "leaves fewer than 2 per group");
  bad = moe;
  bad["n_group"] = 4;
  bad["topk_group"] = 1;
  bad["num_experts_per_tok"] = 3;
  bad["topk_method"] = "group_limited_greedy";
  expect_error(bad, "num_experts_per_tok 3 exceeds the 2 experts of the topk_group 1 kept groups (of 2 each)");
  bad = moe;
  bad.erase("moe_intermediate_size");
  expect_error(bad, "moe_intermediate_size");
}

// Routing ties (equal scores) go to the lower expert, and tied groups to the lower group.
TEST(MoeRouting, TiesGoToTheLowerIndex) {
  MoeConfig m;
  m.n_routed_experts = 8;
  m.num_experts_per_tok = 2;
  m.n_group = 4;
  m.topk_group = 2;
  const std::vector<float> flat(8, 0.25f);
  MoeRoute r;
  moe_route(m, flat.data(), {}, 1, r);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(r.weights[0], 1.0f / 8, 1e-7);
  m.topk_method = MoeConfig::TopK::kGroupLimited;
  // Groups {0,1} {2,3} {4,5} {6,7}: groups 1 and 3 tie for the best expert, ahead of 0 and 2.
  const std::vector<float> logits = {0.0f, 0.0f, 1.0f, 0.5f, 0.0f, 0.0f, 1.0f, 0.9f};
  moe_route(m, logits.data(), {}, 1, r);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{2, 6}));
  m.num_experts_per_tok = 3;
  moe_route(m, logits.data(), {}, 1, r);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{2, 6, 7}));
  // noaux_tc: the bias moves the selection, the weights stay the unbiased sigmoid scores.
  m.topk_method = MoeConfig::TopK::kNoAuxTc;
  m.sigmoid = true;
  m.num_experts_per_tok = 2;
  m.norm_topk_prob = true;
  m.scale_always = true;
  m.routed_scaling_factor = 2.0;
  const std::vector<float> bias = {2.0f, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  moe_route(m, logits.data(), bias, 1, r);
  EXPECT_EQ(r.experts[0], 0);
  EXPECT_EQ(r.experts[1], 1);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.0f, 1e-6);
  // Experts of the groups left out are out (-inf), even where every kept expert's biased score
  // is negative (a mask of 0.0 would pick them instead).
  m.topk_group = 1;
  const std::vector<float> negative = {-5.0f, -5.0f, -9.0f, -9.0f, -9.0f, -9.0f, -9.0f, -9.0f};
  moe_route(m, logits.data(), negative, 1, r);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 1}));
  // Bad routings are refused, not read out of bounds.
  MoeConfig bad = m;
  bad.num_experts_per_tok = 9;
  EXPECT_THROW(moe_route(bad, logits.data(), bias, 1, r), Error);
  bad = m;
  bad.n_group = 8;
  EXPECT_THROW(moe_route(bad, logits.data(), bias, 1, r), Error);
  EXPECT_THROW(moe_route(m, logits.data(), std::vector<float>(3, 0.0f), 1, r), Error);
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
