// config.json parsing with nlohmann::json; every missing or bad field is reported by name.
#include "specula/model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <nlohmann/json.hpp>

#include "specula/core/error.h"
#include "specula/core/json_reader.h"
#include "specula/model/rope.h"

namespace specula {

namespace {

using json = nlohmann::json;

// Upper bounds far above every published model and low enough that no allocation sized by them
// can exhaust a machine before the checkpoint's shapes are compared with the config.
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxWidth = 1 << 17;       // hidden_size, q_lora_rank
constexpr int64_t kMaxIntermediate = 1 << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxPositions = int64_t{1} << 30;

int require_int(const JsonReader& j, const char* key, int64_t min_value, int64_t max_value) {
  return static_cast<int>(j.at(key).integer(min_value, max_value));
}

// dual_chunk_attention_config's sparse prefill: sparse_attention_config is one object per layer
// mapping each query head ("0", "1", ...) to ["vertical_and_slash", vertical, slash, ...].
void parse_dual_chunk_sparse(const JsonReader& dca, ModelConfig& c) {
  DualChunkAttentionConfig& d = c.dual_chunk;
  const auto layers = dca.find("sparse_attention_config");
  // Enabled without a pattern is dense prefill, as vLLM reads it ("sparse attention will not be
  // enabled as sparse attention config is not provided"); the other keys matter only with one.
  d.sparse_enabled = dca.bool_or("sparse_attention_enabled", layers.has_value()) && layers.has_value();
  if (!d.sparse_enabled) return;
  d.sparse_threshold = static_cast<int>(dca.int_or("sparse_attention_threshold", 32768, 0, kMaxPositions));
  d.sparse_last_q = static_cast<int>(dca.int_or("sparse_attention_last_q", 64, 1, 1 << 16));
  if (!layers->is_array()) layers->fail(fmt::format("must be a list of one object per layer ({})", c.num_hidden_layers));
  if (static_cast<int>(layers->size()) != c.num_hidden_layers) {
    layers->fail(fmt::format("has {} layers; expected one object per layer ({})", layers->size(), c.num_hidden_layers));
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const JsonReader layer = (*layers)[static_cast<size_t>(l)];
    if (!layer.is_object() || static_cast<int>(layer.raw().size()) != c.num_attention_heads) {
      layer.fail(fmt::format("must map each query head \"0\" to \"{}\" to its pattern ({} entries found)",
                             c.num_attention_heads - 1, layer.is_object() ? layer.raw().size() : 0));
    }
    std::vector<int>& vertical = d.sparse_vertical.emplace_back();
    std::vector<int>& slash = d.sparse_slash.emplace_back();
    for (int h = 0; h < c.num_attention_heads; ++h) {
      const JsonReader head = layer.at(std::to_string(h));
      if (!head.is_array() || head.size() < 3) head.fail("must be [\"vertical_and_slash\", vertical, slash, ...]");
      const std::string type = head[0].string();
      if (type != "vertical_and_slash") head[0].fail(fmt::format("'{}' is not supported; supported: vertical_and_slash", type));
      const int v = static_cast<int>(head[1].integer(0, kMaxPositions));
      vertical.push_back(v == 30 ? 130 : v);
      slash.push_back(static_cast<int>(head[2].integer(1, kMaxPositions)));
    }
  }
}

// DeepSeek's mixture-of-experts fields (MoeConfig); none when n_routed_experts is absent or null.
void parse_moe(const JsonReader& j, ModelConfig& c) {
  MoeConfig& e = c.moe;
  e.n_routed_experts = static_cast<int>(j.int_or("n_routed_experts", 0, 0, 1 << 16));
  if (e.n_routed_experts == 0) return;
  e.num_experts_per_tok = require_int(j, "num_experts_per_tok", 1, e.n_routed_experts);
  e.n_shared_experts = static_cast<int>(j.int_or("n_shared_experts", 0, 0, 1 << 10));
  e.moe_intermediate_size = require_int(j, "moe_intermediate_size", 1, kMaxIntermediate);
  const int first_dense = static_cast<int>(j.int_or("first_k_dense_replace", 0, 0, kMaxLayers));
  const int freq = static_cast<int>(j.int_or("moe_layer_freq", 1, 1, kMaxLayers));
  for (int l = 0; l < c.num_hidden_layers; ++l) e.layers.push_back(l >= first_dense && l % freq == 0 ? 1 : 0);
  // DeepseekV3Config's defaults where V3's fields are absent (8 groups keeping 4, normalised,
  // scaled by 2.5); V2's are one group, not normalised, not scaled.
  const bool v3 = c.architecture == "DeepseekV3ForCausalLM";
  e.n_group = static_cast<int>(j.int_or("n_group", v3 ? std::min(8, e.n_routed_experts) : 1, 1, e.n_routed_experts));
  e.topk_group = static_cast<int>(j.int_or("topk_group", v3 ? std::min(4, e.n_group) : 1, 1, e.n_group));
  SPECULA_CHECK(e.n_routed_experts % e.n_group == 0, "config.json: n_group {} does not divide n_routed_experts {}",
                e.n_group, e.n_routed_experts);
  e.routed_scaling_factor = j.number_or("routed_scaling_factor", v3 ? 2.5 : 1.0);
  SPECULA_CHECK(e.routed_scaling_factor > 0 && std::isfinite(e.routed_scaling_factor),
                "config.json: routed_scaling_factor {} must be positive", e.routed_scaling_factor);
  e.norm_topk_prob = j.bool_or("norm_topk_prob", v3);
  const std::string scoring = j.string_or("scoring_func", v3 ? "sigmoid" : "softmax");
  SPECULA_CHECK(scoring == "softmax" || scoring == "sigmoid",
                "config.json: scoring_func '{}' is not supported; supported: softmax, sigmoid", scoring);
  e.sigmoid = scoring == "sigmoid";
  const std::string method = j.string_or("topk_method", v3 ? "noaux_tc" : "greedy");
  if (method == "greedy") {
    e.topk_method = MoeConfig::TopK::kGreedy;
  } else if (method == "group_limited_greedy") {
    e.topk_method = MoeConfig::TopK::kGroupLimited;
  } else if (method == "noaux_tc") {
    e.topk_method = MoeConfig::TopK::kNoAuxTc;
    SPECULA_CHECK(e.n_routed_experts / e.n_group >= 2,
                  "config.json: noaux_tc ranks groups by their two best experts; n_routed_experts {} / n_group {} "
                  "leaves fewer than 2 per group",
                  e.n_routed_experts, e.n_group);
  } else {
    SPECULA_CHECK(false, "config.json: topk_method '{}' is not supported; supported: greedy, group_limited_greedy, noaux_tc",
                  method);
  }
  SPECULA_CHECK(e.topk_method == MoeConfig::TopK::kGreedy ||
                    e.num_experts_per_tok <= e.topk_group * (e.n_routed_experts / e.n_group),
                "config.json: num_experts_per_tok {} exceeds the {} experts of the topk_group {} kept groups (of {} each)",
                e.num_experts_per_tok, e.topk_group * (e.n_routed_experts / e.n_group), e.topk_group,
                e.n_routed_experts / e.n_group);
  e.scale_always = v3;
}

// Qwen3-MoE's and Mixtral's experts: softmax scores, the top num_experts_per_tok, no shared
// experts, no scaling; Qwen3-MoE normalises when norm_topk_prob, Mixtral always.
void parse_llama_moe(const JsonReader& j, ModelConfig& c) {
  MoeConfig& e = c.moe;
  const bool mixtral = c.architecture == "MixtralForCausalLM";
  e.n_routed_experts = require_int(j, mixtral ? "num_local_experts" : "num_experts", 1, 1 << 16);
  e.num_experts_per_tok = require_int(j, "num_experts_per_tok", 1, e.n_routed_experts);
  e.moe_intermediate_size = mixtral ? c.intermediate_size : require_int(j, "moe_intermediate_size", 1, kMaxIntermediate);
  e.norm_topk_prob = mixtral || j.bool_or("norm_topk_prob", false);
  e.norm_single = true;
  e.mixtral_names = mixtral;
  SPECULA_CHECK(c.hidden_act == "silu", "config.json: activation '{}' is not supported for {}'s experts; supported: silu",
                c.hidden_act, c.architecture);
  std::vector<int> dense;
  if (const auto only = j.find("mlp_only_layers"); only && !mixtral) {
    if (!only->is_array()) only->fail("must be an array of layer indices");
    only->for_each([&](const JsonReader& x) { dense.push_back(static_cast<int>(x.integer(0, kMaxLayers))); });
  }
  const int step = mixtral ? 1 : static_cast<int>(j.int_or("decoder_sparse_step", 1, 1, kMaxLayers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const bool sparse = std::find(dense.begin(), dense.end(), l) == dense.end() && (l + 1) % step == 0;
    e.layers.push_back(sparse ? 1 : 0);
  }
}

// The DeepSeek-V2/V3 fields (after rope scaling is known: the softmax scale depends on it).
void parse_mla(const JsonReader& j, ModelConfig& c) {
  MlaConfig& m = c.mla;
  m.q_lora_rank = static_cast<int>(j.int_or("q_lora_rank", 0, 1, kMaxWidth));
  m.kv_lora_rank = require_int(j, "kv_lora_rank", 1, kMaxWidth);
  m.qk_nope_head_dim = require_int(j, "qk_nope_head_dim", 1, kMaxHeadDim);
  m.qk_rope_head_dim = c.head_dim;
  m.v_head_dim = require_int(j, "v_head_dim", 1, kMaxHeadDim);
  m.rope_interleave = j.bool_or("rope_interleave", true);
  m.softmax_scale = 1.0 / std::sqrt(static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim));
  if (c.rope_scaling.mscale_all_dim != 0) {
    const double mscale = yarn_get_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    m.softmax_scale *= mscale * mscale;
  }
  SPECULA_CHECK(!c.attention_bias, "config.json: attention_bias is not supported for {}", c.architecture);
  SPECULA_CHECK(c.hidden_act == "silu", "config.json: activation '{}' is not supported for {}; supported: silu",
                c.hidden_act, c.architecture);
  parse_moe(j, c);
}

std::vector<int> eos_ids(const JsonReader& e) {
  std::vector<int> ids;
  if (e.is_array()) {
    e.for_each([&](const JsonReader& x) { ids.push_back(static_cast<int>(x.integer(0, INT32_MAX))); });
  } else {
    ids.push_back(static_cast<int>(e.integer(0, INT32_MAX)));
  }
  return ids;
}

// quantization_config: fp8 e4m3 weights with block scales and dynamic activation scales, as
// DeepSeek-V3 ships them (weights are dequantized on load; model/fp8_weights.h).
void parse_quantization(const JsonReader& q, ModelConfig& c) {
  const std::string method = q.string_or("quant_method", "");
  SPECULA_CHECK(method == "fp8",
                "config.json: quantization_config quant_method '{}' is not supported; supported: fp8 (e4m3 weights "
                "with block scales)",
                method);
  const std::string format = q.string_or("fmt", "e4m3");
  SPECULA_CHECK(format == "e4m3", "config.json: quantization_config fmt '{}' is not supported; supported: e4m3", format);
  const std::string activations = q.string_or("activation_scheme", "dynamic");
  SPECULA_CHECK(activations == "dynamic",
                "config.json: quantization_config activation_scheme '{}' is not supported; supported: dynamic",
                activations);
  SPECULA_CHECK(q.has("weight_block_size"),
                "config.json: quantization_config needs weight_block_size (per-tensor fp8 scales are not supported)");
  const JsonReader block = q.at("weight_block_size");
  if (!block.is_array() || block.size() != 2) block.fail("must be [rows, columns]");
  c.fp8_block_out = static_cast<int>(block[0].integer(1, 1 << 16));
  c.fp8_block_in = static_cast<int>(block[1].integer(1, 1 << 16));
}

ModelConfig parse_config_object(const JsonReader& j) {
  ModelConfig c;
  const JsonReader architectures = j.at("architectures");
  if (!architectures.is_array() || architectures.size() == 0) architectures.fail("must be a non-empty array");
  c.architecture = architectures[0].string();
  const auto& supported = supported_architectures();
  SPECULA_CHECK(std::find(supported.begin(), supported.end(), c.architecture) != supported.end(),
                "architecture '{}' is not supported; supported: {}", c.architecture, fmt::join(supported, ", "));
  c.model_type = j.string_or("model_type", "");
  if (j.has("quantization_config")) parse_quantization(j.at("quantization_config"), c);
  c.vocab_size = require_int(j, "vocab_size", 1, kMaxVocab);
  c.hidden_size = require_int(j, "hidden_size", 1, kMaxWidth);
  c.intermediate_size = require_int(j, "intermediate_size", 1, kMaxIntermediate);
  c.num_hidden_layers = require_int(j, "num_hidden_layers", 1, kMaxLayers);
  c.num_attention_heads = require_int(j, "num_attention_heads", 1, kMaxHeads);
  c.num_key_value_heads =
      static_cast<int>(j.int_or("num_key_value_heads", c.num_attention_heads, 1, c.num_attention_heads));
  SPECULA_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                "config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                c.num_attention_heads, c.num_key_value_heads);
  const bool deepseek = c.architecture.rfind("Deepseek", 0) == 0;
  if (deepseek) {
    // MLA's per-head widths are their own fields; head_dim is the rotated part (as transformers sets it).
    c.head_dim = require_int(j, "qk_rope_head_dim", 2, kMaxHeadDim);
  } else if (j.has("head_dim")) {
    c.head_dim = require_int(j, "head_dim", 1, kMaxHeadDim);
  } else {
    SPECULA_CHECK(c.hidden_size % c.num_attention_heads == 0,
                  "config.json: hidden_size {} is not divisible by num_attention_heads {}", c.hidden_size,
                  c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
    SPECULA_CHECK(c.head_dim <= kMaxHeadDim, "config.json: head_dim {} (hidden_size / num_attention_heads) is out of "
                  "range [1, {}]", c.head_dim, kMaxHeadDim);
  }
  SPECULA_CHECK(c.head_dim % 2 == 0, "config.json: head_dim {} must be even for RoPE", c.head_dim);
  c.max_position_embeddings = static_cast<int>(j.int_or("max_position_embeddings", 4096, 1, kMaxPositions));
  c.rms_norm_eps = j.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = j.number_or("rope_theta", 10000.0);
  c.tie_word_embeddings = j.bool_or("tie_word_embeddings", false);
  auto flag = [&](const char* key) { return j.bool_or(key, false); };
  c.attention_bias = c.architecture == "Qwen2ForCausalLM" || flag("attention_bias");
  // Llama / Qwen3 with attention_bias put a bias on o_proj too; Qwen2's o_proj has none.
  c.o_proj_bias = c.architecture != "Qwen2ForCausalLM" && flag("attention_bias");
  c.mlp_bias = flag("mlp_bias");
  c.qk_norm = c.architecture == "Qwen3ForCausalLM" || c.architecture == "Qwen3MoeForCausalLM";
  // Mistral's default window is 4096 tokens when the field is absent (transformers' MistralConfig).
  const int default_window = c.architecture == "MistralForCausalLM" && !j.raw().contains("sliding_window") ? 4096 : -1;
  const int window = static_cast<int>(j.int_or("sliding_window", default_window, 1, INT32_MAX));
  const bool qwen = c.architecture == "Qwen2ForCausalLM" || c.architecture == "Qwen3ForCausalLM" ||
                    c.architecture == "Qwen3MoeForCausalLM";
  // Mixtral slides only when its config gives a window (transformers' default is none).
  const bool use_window = qwen ? j.bool_or("use_sliding_window", false)
                               : c.architecture == "MistralForCausalLM" || (c.architecture == "MixtralForCausalLM" && window > 0);
  const int first_window_layer = qwen ? static_cast<int>(j.int_or("max_window_layers", 0, 0, INT32_MAX)) : 0;
  c.gemma2 = c.architecture == "Gemma2ForCausalLM";
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    // Gemma-2 alternates: even layers slide, odd layers see everything.
    const bool slides = c.gemma2 ? l % 2 == 0 : use_window && l >= first_window_layer;
    c.layer_sliding_window.push_back(slides ? window : -1);
  }
  for (const char* key : {"hidden_act", "hidden_activation"}) c.hidden_act = j.string_or(key, c.hidden_act);
  SPECULA_CHECK(c.hidden_act == "silu" || c.hidden_act == "gelu_pytorch_tanh",
                "config.json: activation '{}' is not supported; supported: silu, gelu_pytorch_tanh", c.hidden_act);
  c.attn_logit_softcapping = j.number_or("attn_logit_softcapping", 0.0);
  c.final_logit_softcapping = j.number_or("final_logit_softcapping", 0.0);
  c.query_pre_attn_scalar = j.number_or("query_pre_attn_scalar", 0.0);
  if (c.gemma2) c.tie_word_embeddings = j.bool_or("tie_word_embeddings", true);
  c.torch_dtype = j.string_or("torch_dtype", "bfloat16");
  c.bos_token_id = static_cast<int>(j.int_or("bos_token_id", -1, 0, INT32_MAX));
  if (const auto e = j.find("eos_token_id")) c.eos_token_ids = eos_ids(*e);
  std::optional<JsonReader> rs;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (const auto r = j.find(key); r && r->is_object()) rs = r;
  }
  if (rs) {
    const JsonReader& r = *rs;
    c.rope_scaling.type = r.string_or("rope_type", r.string_or("type", "default"));
    c.rope_scaling.factor = r.number_or("factor", 1.0);
    c.rope_scaling.low_freq_factor = r.number_or("low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = r.number_or("high_freq_factor", 4.0);
    const double original = r.number_or("original_max_position_embeddings", c.max_position_embeddings);
    SPECULA_CHECK(original >= 1 && original <= static_cast<double>(kMaxPositions),
                  "config.json: rope scaling original_max_position_embeddings {} is out of range [1, {}]", original,
                  kMaxPositions);
    c.rope_scaling.original_max_position_embeddings = static_cast<int>(original);
    c.rope_scaling.beta_fast = r.number_or("beta_fast", 32.0);
    c.rope_scaling.beta_slow = r.number_or("beta_slow", 1.0);
    c.rope_scaling.attention_factor = r.number_or("attention_factor", 0.0);
    c.rope_scaling.mscale = r.number_or("mscale", 0.0);
    c.rope_scaling.mscale_all_dim = r.number_or("mscale_all_dim", 0.0);
    c.rope_scaling.truncate = r.bool_or("truncate", true);
    c.rope_theta = r.number_or("rope_theta", c.rope_theta);
    static const char* kTypes[] = {"default", "linear", "dynamic", "llama3", "yarn"};
    SPECULA_CHECK(std::find(std::begin(kTypes), std::end(kTypes), c.rope_scaling.type) != std::end(kTypes),
                  "config.json: rope scaling type '{}' is not supported; supported: default, linear, dynamic, llama3, yarn",
                  c.rope_scaling.type);
    SPECULA_CHECK(c.rope_scaling.factor >= 1.0, "config.json: rope scaling factor {} must be >= 1", c.rope_scaling.factor);
  }
  if (const auto dca = j.find("dual_chunk_attention_config"); dca && dca->is_object()) {
    // SGLang's defaults for absent keys.
    c.dual_chunk.chunk_size = static_cast<int>(dca->int_or("chunk_size", 8192, 2, kMaxPositions));
    c.dual_chunk.local_size = static_cast<int>(dca->int_or("local_size", 1024, 0, kMaxPositions));
    c.dual_chunk.original_max_position_embeddings =
        static_cast<int>(dca->int_or("original_max_position_embeddings", 0, 0, kMaxPositions));
    SPECULA_CHECK(c.dual_chunk.local_size < c.dual_chunk.chunk_size,
                  "config.json: dual_chunk_attention_config local_size {} must be below chunk_size {}",
                  c.dual_chunk.local_size, c.dual_chunk.chunk_size);
    SPECULA_CHECK(!deepseek, "config.json: dual_chunk_attention_config is not supported for {}", c.architecture);
    parse_dual_chunk_sparse(*dca, c);
  }
  SPECULA_CHECK(c.rope_theta > 0, "config.json: rope_theta {} must be positive", c.rope_theta);
  SPECULA_CHECK(c.rms_norm_eps >= 0, "config.json: rms_norm_eps {} must not be negative", c.rms_norm_eps);
  if (deepseek) parse_mla(j, c);
  if (c.architecture == "Qwen3MoeForCausalLM" || c.architecture == "MixtralForCausalLM") parse_llama_moe(j, c);
  return c;
}

}  // namespace

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                                 "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
                                                 "Gemma2ForCausalLM",
                                                 "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"};
  return names;
}

ModelConfig parse_model_config(const std::string& json_text) {
  const json j = JsonReader::parse(json_text, "config.json");
  SPECULA_CHECK(j.is_object(), "config.json must hold a JSON object");
  return parse_config_object(JsonReader(j, "config.json"));
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "config.json";
  SPECULA_CHECK(std::filesystem::is_regular_file(path), "cannot read {}: is '{}' a Hugging Face model folder?",
                path.string(), model_dir.string());
  ModelConfig c = parse_model_config(read_text_file(path));
  // generation_config.json may list more end-of-sequence ids (Llama-3 Instruct's <|eot_id|>).
  const auto gen_path = model_dir / "generation_config.json";
  if (std::filesystem::exists(gen_path)) {
    const json g = JsonReader::parse_file(gen_path, "generation_config.json");
    const JsonReader gen(g, "generation_config.json");
    if (const auto e = gen.find("eos_token_id")) {
      for (int id : eos_ids(*e)) {
        if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) c.eos_token_ids.push_back(id);
      }
    }
  }
  return c;
}

}  // namespace specula
