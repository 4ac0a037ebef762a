// config.json parsing with nlohmann::json; every missing or bad field is reported by name.
#include "specula/model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "specula/core/error.h"
#include "specula/model/rope.h"

namespace specula {

namespace {

using json = nlohmann::json;

int require_int(const json& j, const char* key, int min_value) {
  SPECULA_CHECK(j.contains(key) && j[key].is_number_integer(), "config.json: '{}' is missing or not an integer", key);
  const int64_t v = j[key].get<int64_t>();
  SPECULA_CHECK(v >= min_value && v <= INT32_MAX, "config.json: '{}' = {} is out of range (at least {})", key, v,
                min_value);
  return static_cast<int>(v);
}

double number_or(const json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  SPECULA_CHECK(j[key].is_number(), "config.json: '{}' must be a number", key);
  return j[key].get<double>();
}

// The DeepSeek-V2/V3 fields (after rope scaling is known: the softmax scale depends on it).
void parse_mla(const json& j, ModelConfig& c) {
  MlaConfig& m = c.mla;
  m.q_lora_rank = j.contains("q_lora_rank") && !j["q_lora_rank"].is_null() ? require_int(j, "q_lora_rank", 1) : 0;
  m.kv_lora_rank = require_int(j, "kv_lora_rank", 1);
  m.qk_nope_head_dim = require_int(j, "qk_nope_head_dim", 1);
  m.qk_rope_head_dim = c.head_dim;
  m.v_head_dim = require_int(j, "v_head_dim", 1);
  m.rope_interleave = !j.contains("rope_interleave") || !j["rope_interleave"].is_boolean() || j["rope_interleave"].get<bool>();
  m.softmax_scale = 1.0 / std::sqrt(static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim));
  if (c.rope_scaling.mscale_all_dim != 0) {
    const double mscale = yarn_get_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    m.softmax_scale *= mscale * mscale;
  }
  SPECULA_CHECK(!c.attention_bias, "config.json: attention_bias is not supported for {}", c.architecture);
  SPECULA_CHECK(c.hidden_act == "silu", "config.json: activation '{}' is not supported for {}; supported: silu",
                c.hidden_act, c.architecture);
  // Mixture-of-experts layers: every moe_layer_freq-th layer from first_k_dense_replace on.
  if (j.contains("n_routed_experts") && j["n_routed_experts"].is_number_integer() && j["n_routed_experts"].get<int>() > 0) {
    const int first_dense = j.contains("first_k_dense_replace") ? require_int(j, "first_k_dense_replace", 0) : 0;
    const int freq = j.contains("moe_layer_freq") ? require_int(j, "moe_layer_freq", 1) : 1;
    for (int l = first_dense; l < c.num_hidden_layers; ++l) {
      SPECULA_CHECK(l % freq != 0,
                    "config.json: layer {} is a mixture-of-experts layer (n_routed_experts {}, first_k_dense_replace {}); "
                    "specula runs {} with dense MLP layers only",
                    l, j["n_routed_experts"].get<int>(), first_dense, c.architecture);
    }
  }
}

}  // namespace

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                                 "Qwen3ForCausalLM", "Gemma2ForCausalLM",
                                                 "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"};
  return names;
}

ModelConfig parse_config_object(const json& j);

ModelConfig parse_model_config(const std::string& json_text) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    SPECULA_CHECK(false, "config.json is not valid JSON: {}", e.what());
  }
  SPECULA_CHECK(j.is_object(), "config.json must hold a JSON object");
  try {
    return parse_config_object(j);
  } catch (const json::exception& e) {
    // A field of the wrong JSON type (null where a number belongs, ...).
    SPECULA_CHECK(false, "config.json: a field has an unexpected type: {}", e.what());
  }
  return {};
}

ModelConfig parse_config_object(const json& j) {
  ModelConfig c;
  SPECULA_CHECK(j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
                    j["architectures"][0].is_string(),
                "config.json: 'architectures' is missing");
  c.architecture = j["architectures"][0].get<std::string>();
  const auto& supported = supported_architectures();
  SPECULA_CHECK(std::find(supported.begin(), supported.end(), c.architecture) != supported.end(),
                "architecture '{}' is not supported; supported: {}", c.architecture, fmt::join(supported, ", "));
  c.model_type = j.value("model_type", "");
  SPECULA_CHECK(!j.contains("quantization_config"),
                "config.json: quantized checkpoints (quantization_config) are not supported; give bf16, f16 or f32 weights");
  c.vocab_size = require_int(j, "vocab_size", 1);
  c.hidden_size = require_int(j, "hidden_size", 1);
  c.intermediate_size = require_int(j, "intermediate_size", 1);
  c.num_hidden_layers = require_int(j, "num_hidden_layers", 1);
  c.num_attention_heads = require_int(j, "num_attention_heads", 1);
  c.num_key_value_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                              ? require_int(j, "num_key_value_heads", 1)
                              : c.num_attention_heads;
  SPECULA_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                "config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                c.num_attention_heads, c.num_key_value_heads);
  const bool deepseek = c.architecture.rfind("Deepseek", 0) == 0;
  if (deepseek) {
    // MLA's per-head widths are their own fields; head_dim is the rotated part (as transformers sets it).
    c.head_dim = require_int(j, "qk_rope_head_dim", 2);
  } else if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = require_int(j, "head_dim", 1);
  } else {
    SPECULA_CHECK(c.hidden_size % c.num_attention_heads == 0,
                  "config.json: hidden_size {} is not divisible by num_attention_heads {}", c.hidden_size,
                  c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  SPECULA_CHECK(c.head_dim % 2 == 0, "config.json: head_dim {} must be even for RoPE", c.head_dim);
  c.max_position_embeddings = j.contains("max_position_embeddings") ? require_int(j, "max_position_embeddings", 1) : 4096;
  c.rms_norm_eps = number_or(j, "rms_norm_eps", 1e-6);
  c.rope_theta = number_or(j, "rope_theta", 10000.0);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  auto flag = [&](const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); };
  c.attention_bias = c.architecture == "Qwen2ForCausalLM" || flag("attention_bias");
  // Llama / Qwen3 with attention_bias put a bias on o_proj too; Qwen2's o_proj has none.
  c.o_proj_bias = c.architecture != "Qwen2ForCausalLM" && flag("attention_bias");
  c.mlp_bias = flag("mlp_bias");
  c.qk_norm = c.architecture == "Qwen3ForCausalLM";
  // Mistral's default window is 4096 tokens when the field is absent (transformers' MistralConfig).
  int window = c.architecture == "MistralForCausalLM" && !j.contains("sliding_window") ? 4096 : -1;
  if (j.contains("sliding_window") && j["sliding_window"].is_number_integer()) window = j["sliding_window"].get<int>();
  SPECULA_CHECK(window == -1 || window >= 1, "config.json: sliding_window {} must be positive or null", window);
  const bool qwen = c.architecture == "Qwen2ForCausalLM" || c.architecture == "Qwen3ForCausalLM";
  const bool use_window = qwen ? (j.contains("use_sliding_window") && j["use_sliding_window"].is_boolean() &&
                                   j["use_sliding_window"].get<bool>())
                               : c.architecture == "MistralForCausalLM";
  const int first_window_layer =
      qwen && j.contains("max_window_layers") && j["max_window_layers"].is_number_integer() ? j["max_window_layers"].get<int>() : 0;
  c.gemma2 = c.architecture == "Gemma2ForCausalLM";
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    // Gemma-2 alternates: even layers slide, odd layers see everything.
    const bool slides = c.gemma2 ? l % 2 == 0 : use_window && l >= first_window_layer;
    c.layer_sliding_window.push_back(slides ? window : -1);
  }
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    if (j.contains(key) && j[key].is_string()) c.hidden_act = j[key].get<std::string>();
  }
  SPECULA_CHECK(c.hidden_act == "silu" || c.hidden_act == "gelu_pytorch_tanh",
                "config.json: activation '{}' is not supported; supported: silu, gelu_pytorch_tanh", c.hidden_act);
  c.attn_logit_softcapping = number_or(j, "attn_logit_softcapping", 0.0);
  c.final_logit_softcapping = number_or(j, "final_logit_softcapping", 0.0);
  c.query_pre_attn_scalar = number_or(j, "query_pre_attn_scalar", 0.0);
  if (c.gemma2) c.tie_word_embeddings = j.value("tie_word_embeddings", true);
  c.torch_dtype = j.value("torch_dtype", std::string("bfloat16"));
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int>();
  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int>());
    if (e.is_array()) {
      for (const json& x : e) {
        SPECULA_CHECK(x.is_number_integer(), "config.json: 'eos_token_id' entries must be integers");
        c.eos_token_ids.push_back(x.get<int>());
      }
    }
  }
  const json* rs = nullptr;
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rs = &j["rope_scaling"];
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rs = &j["rope_parameters"];
  if (rs != nullptr) {
    const json& r = *rs;
    c.rope_scaling.type = r.value("rope_type", r.value("type", std::string("default")));
    c.rope_scaling.factor = number_or(r, "factor", 1.0);
    c.rope_scaling.low_freq_factor = number_or(r, "low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = number_or(r, "high_freq_factor", 4.0);
    c.rope_scaling.original_max_position_embeddings =
        static_cast<int>(number_or(r, "original_max_position_embeddings", c.max_position_embeddings));
    c.rope_scaling.beta_fast = number_or(r, "beta_fast", 32.0);
    c.rope_scaling.beta_slow = number_or(r, "beta_slow", 1.0);
    c.rope_scaling.attention_factor = number_or(r, "attention_factor", 0.0);
    c.rope_scaling.mscale = number_or(r, "mscale", 0.0);
    c.rope_scaling.mscale_all_dim = number_or(r, "mscale_all_dim", 0.0);
    c.rope_scaling.truncate = !r.contains("truncate") || !r["truncate"].is_boolean() || r["truncate"].get<bool>();
    if (r.contains("rope_theta")) c.rope_theta = number_or(r, "rope_theta", c.rope_theta);
    static const char* kTypes[] = {"default", "linear", "dynamic", "llama3", "yarn"};
    SPECULA_CHECK(std::find(std::begin(kTypes), std::end(kTypes), c.rope_scaling.type) != std::end(kTypes),
                  "config.json: rope scaling type '{}' is not supported; supported: default, linear, dynamic, llama3, yarn",
                  c.rope_scaling.type);
    SPECULA_CHECK(c.rope_scaling.factor >= 1.0, "config.json: rope scaling factor {} must be >= 1", c.rope_scaling.factor);
  }
  if (deepseek) parse_mla(j, c);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "config.json";
  std::ifstream in(path);
  SPECULA_CHECK(in.good(), "cannot read {}: is '{}' a Hugging Face model folder?", path.string(), model_dir.string());
  std::stringstream text;
  text << in.rdbuf();
  ModelConfig c = parse_model_config(text.str());
  // generation_config.json may list more end-of-sequence ids (Llama-3 Instruct's <|eot_id|>).
  const auto gen_path = model_dir / "generation_config.json";
  if (std::filesystem::exists(gen_path)) {
    std::ifstream gen_in(gen_path);
    std::stringstream gen_text;
    gen_text << gen_in.rdbuf();
    const json g = json::parse(gen_text.str(), nullptr, false);
    SPECULA_CHECK(!g.is_discarded(), "{} is not valid JSON", gen_path.string());
    if (g.contains("eos_token_id")) {
      const json& e = g["eos_token_id"];
      std::vector<int> ids;
      if (e.is_number_integer()) ids.push_back(e.get<int>());
      if (e.is_array()) {
        for (const json& x : e) {
          if (x.is_number_integer()) ids.push_back(x.get<int>());
        }
      }
      for (int id : ids) {
        if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) c.eos_token_ids.push_back(id);
      }
    }
  }
  return c;
}

}  // namespace specula
