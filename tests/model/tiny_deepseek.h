// A tiny random DeepSeek-V2/V3 checkpoint (dense or mixture-of-experts MLP layers) and an independent float64
// implementation of the Hugging Face definition in the expanded form (per-head keys and values
// from kv_b_proj, full causal softmax, no KV cache), for the CPU and CUDA model tests.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "specula/kv/mla_kv_pool.h"
#include "specula/runtime/generator.h"
#include "tiny_checkpoint.h"

namespace specula::test {

struct DeepseekShape {
  std::string arch = "DeepseekV2ForCausalLM";
  int vocab = 259, hidden = 96, inter = 128, layers = 2, heads = 4;
  int q_lora = 0;  // 0: q_proj
  int kv_lora = 64, nope = 32, rope = 16, v = 24;
  bool yarn = false;        // rope_scaling yarn, factor 4 over 64 original positions, DeepSeek's mscales
  bool interleave = true;   // rope_interleave
  double eps = 1e-5, theta = 10000.0;  // rms_norm_eps: not the latent norms' 1e-6
  // Mixture of experts from layer first_dense on (experts 0: every layer dense). Scores are
  // softmax for V2, sigmoid for V3; topk_method greedy, group_limited_greedy or noaux_tc.
  int experts = 0, top_k = 2, shared = 1, moe_inter = 32, first_dense = 1, n_group = 1, topk_group = 1;
  std::string topk_method = "greedy";
  bool norm_topk = false;
  double scaling = 1.0;
};

struct TinyDeepseek {
  DeepseekShape shape;
  TinyWeights weights;
};

TinyDeepseek make_tiny_deepseek(const DeepseekShape& shape, uint32_t seed);
nlohmann::json deepseek_config(const DeepseekShape& shape);

// DeepSeek-V3's fp8 layout on a tiny model: every projection matrix ("*_proj.weight": attention
// and experts; not the router, norms, embedding or head) as e4m3 codes with [block, block] scales
// (quantize_fp8_blocks), and the config's quantization_config to match.
void quantize_deepseek_fp8(TinyDeepseek& model, int block);
void add_fp8_quantization_config(nlohmann::json& config, int block);

// Logits of every position of ids, [ids.size(), vocab]. The cached latent rows (c, and k_pe after
// RoPE) go through the cache format's encoding first, as the model's keys and values do.
// routing_margin (optional): the smallest gap, over every token and MoE layer, between the last
// expert (or group) picked and the first left out; below kRoutingMargin a rounding difference
// could route a token elsewhere, so such a step or model is not compared.
std::vector<double> deepseek_reference_logits(const TinyDeepseek& model, MlaKVFormat cache,
                                              const std::vector<int32_t>& ids, double* routing_margin = nullptr);
// The f32 path's MoE input differs from the f64 one by ~1e-5 relative, which moves a logit by
// ~5e-5 (softmax margins are logit gaps) or a sigmoid score by less.
inline constexpr double kRoutingMargin = 1e-4;

// How far logits are from the reference: max |got - want| over all entries, max |want|, and
// whether every got is finite.
struct LogitError {
  double max_err = 0, max_abs = 0;
  bool finite = true;
};
LogitError logit_error(const std::vector<float>& got, const std::vector<double>& want);

// Walks a greedy continuation of prompt: at each step where the reference's top two logits are
// more than margin apart (and its routing more than routing_margin: the GPU's bf16 attention
// moves an MoE layer's input further than the CPU's rounding does), the token must be the
// reference's argmax. Returns the steps checked and
// a description of every mismatch.
struct GreedyCheck {
  int checked = 0;
  std::vector<std::string> mismatches;
};
GreedyCheck check_greedy(const TinyDeepseek& model, MlaKVFormat cache, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output, double margin, double routing_margin = kRoutingMargin);

// Greedy-decodes max_new tokens after prompt with gen and checks them with check_greedy, at a
// margin of a few times the error measured on the prompt's logits (decode steps round as those
// do). A continuation of the wrong length is a mismatch.
GreedyCheck decode_and_check(Generator& gen, const TinyDeepseek& model, MlaKVFormat cache,
                             const std::vector<int32_t>& prompt, int max_new, const LogitError& prompt_error,
                             double routing_margin = kRoutingMargin);

}  // namespace specula::test
