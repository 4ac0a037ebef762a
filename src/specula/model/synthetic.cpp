// Synthetic weights: a cheap counter-based generator fills each requested tensor (weights of
// order 1/sqrt(fan-in), norms near 1), so a forward pass stays numerically tame.
#include "specula/model/synthetic.h"

#include <cmath>
#include <functional>

#include "specula/core/error.h"

namespace specula {

namespace {
uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}
}  // namespace

std::vector<std::string> synthetic_names() { return {"llama3-8b", "llama3.2-1b", "deepseek-v2-lite-dense", "tiny"}; }

ModelConfig synthetic_config(const std::string& name) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.rms_norm_eps = 1e-5;
  if (name == "llama3-8b") {
    c.vocab_size = 128256, c.hidden_size = 4096, c.intermediate_size = 14336, c.num_hidden_layers = 32;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128, c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
  } else if (name == "llama3.2-1b") {
    c.vocab_size = 128256, c.hidden_size = 2048, c.intermediate_size = 8192, c.num_hidden_layers = 16;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 64, c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
    c.tie_word_embeddings = true;
  } else if (name == "deepseek-v2-lite-dense") {
    // DeepSeek-V2-Lite's attention (MLA, no q_lora, YaRN x40) with every layer's MLP dense at the
    // size of its first (dense) layer: specula runs no MoE.
    c.architecture = "DeepseekV2ForCausalLM";
    c.model_type = "deepseek_v2";
    c.rms_norm_eps = 1e-6;
    c.vocab_size = 102400, c.hidden_size = 2048, c.intermediate_size = 10944, c.num_hidden_layers = 27;
    c.num_attention_heads = 16, c.num_key_value_heads = 16, c.head_dim = 64, c.max_position_embeddings = 163840;
    c.mla = MlaConfig{0, 512, 128, 64, 128, true, 0.0};
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 40.0;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.mscale = 0.707;
    c.rope_scaling.mscale_all_dim = 0.707;
    const double mscale = 0.1 * 0.707 * std::log(40.0) + 1.0;
    c.mla.softmax_scale = mscale * mscale / std::sqrt(192.0);
  } else if (name == "tiny") {
    c.vocab_size = 259, c.hidden_size = 256, c.intermediate_size = 640, c.num_hidden_layers = 8;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64, c.max_position_embeddings = 1024;
  } else {
    SPECULA_CHECK(false, "synthetic model '{}' is not known; known: llama3-8b, llama3.2-1b, deepseek-v2-lite-dense, tiny",
                  name);
  }
  c.eos_token_ids = {};
  c.layer_sliding_window.assign(static_cast<size_t>(c.num_hidden_layers), -1);
  return c;
}

SyntheticWeights::SyntheticWeights(const ModelConfig& config, uint64_t seed) : config_(config), seed_(seed) {}

bool SyntheticWeights::contains(const std::string&) const { return true; }

TensorView SyntheticWeights::get(const std::string& name, const Shape& shape) const {
  scratch_ = Buffer(DType::bf16, shape);
  const bool norm = name.find("norm") != std::string::npos;
  const float scale = norm ? 0.05f : 1.0f / std::sqrt(static_cast<float>(shape[shape.rank() - 1]));
  const uint64_t base = mix(seed_ ^ std::hash<std::string>{}(name));
  auto* out = scratch_.data_as<uint16_t>();
  for (int64_t i = 0; i < shape.numel(); ++i) {
    // Uniform in [-sqrt(3), sqrt(3)): unit variance.
    const double u = static_cast<double>(mix(base + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
    const float v = static_cast<float>((u * 2.0 - 1.0) * 1.7320508) * scale + (norm ? 1.0f : 0.0f);
    out[i] = float_to_bf16_bits(v);
  }
  return scratch_.view();
}

size_t SyntheticWeights::total_bytes() const {
  const ModelConfig& c = config_;
  const size_t h = static_cast<size_t>(c.hidden_size), heads = static_cast<size_t>(c.num_attention_heads);
  const size_t q = heads * static_cast<size_t>(c.head_dim), kv = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  size_t attention = 2 * h * q + 2 * h * kv;
  if (c.is_mla()) {
    const MlaConfig& m = c.mla;
    const size_t qk = static_cast<size_t>(m.qk_nope_head_dim + m.qk_rope_head_dim), rank = static_cast<size_t>(m.kv_lora_rank);
    attention = h * heads * qk + h * (rank + static_cast<size_t>(m.qk_rope_head_dim)) + rank +
                heads * static_cast<size_t>(m.qk_nope_head_dim + m.v_head_dim) * rank + heads * static_cast<size_t>(m.v_head_dim) * h;
  }
  const size_t layer = 2 * h + attention + 3 * h * static_cast<size_t>(c.intermediate_size);
  const size_t params = static_cast<size_t>(c.vocab_size) * h * (c.tie_word_embeddings ? 1 : 2) + h +
                        layer * static_cast<size_t>(c.num_hidden_layers);
  return params * 2;  // bf16
}

}  // namespace specula
