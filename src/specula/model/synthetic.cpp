// Synthetic weights: a cheap counter-based generator fills each requested tensor (weights of
// order 1/sqrt(fan-in), norms near 1), so a forward pass stays numerically tame.
#include "specula/model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>
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

// Uniform in [0, 1) from the top 53 bits of mix(x).
double uniform(uint64_t x) { return static_cast<double>(mix(x) >> 11) * 0x1.0p-53; }
}  // namespace

std::vector<std::string> synthetic_names() {
  return {"llama3-8b", "llama3-70b", "llama3.2-1b", "deepseek-v2-lite", "deepseek-v2-lite-dense", "qwen3-30b-a3b", "tiny"};
}

ModelConfig synthetic_config(const std::string& name) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.rms_norm_eps = 1e-5;
  if (name == "llama3-8b") {
    c.vocab_size = 128256, c.hidden_size = 4096, c.intermediate_size = 14336, c.num_hidden_layers = 32;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128, c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
  } else if (name == "llama3-70b") {
    c.vocab_size = 128256, c.hidden_size = 8192, c.intermediate_size = 28672, c.num_hidden_layers = 80;
    c.num_attention_heads = 64, c.num_key_value_heads = 8, c.head_dim = 128, c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
  } else if (name == "llama3.2-1b") {
    c.vocab_size = 128256, c.hidden_size = 2048, c.intermediate_size = 8192, c.num_hidden_layers = 16;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 64, c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
    c.tie_word_embeddings = true;
  } else if (name == "deepseek-v2-lite" || name == "deepseek-v2-lite-dense") {
    // DeepSeek-V2-Lite: MLA (no q_lora, YaRN x40); layer 0 a dense MLP, layers 1-26 64 routed
    // experts (top 6, softmax, greedy, no renormalisation) and 2 shared ones of 1408. The -dense
    // variant has every MLP dense at layer 0's size.
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
    if (name == "deepseek-v2-lite") {
      MoeConfig& m = c.moe;
      m.n_routed_experts = 64, m.num_experts_per_tok = 6, m.n_shared_experts = 2, m.moe_intermediate_size = 1408;
      m.layers.assign(static_cast<size_t>(c.num_hidden_layers), 1);
      m.layers[0] = 0;
    }
  } else if (name == "qwen3-30b-a3b") {
    // Qwen3-30B-A3B: 48 layers of GQA (32 / 4 heads of 128, q/k norms) and 128 experts of 768
    // (top 8, renormalised), no shared expert.
    c.architecture = "Qwen3MoeForCausalLM";
    c.model_type = "qwen3_moe";
    c.rms_norm_eps = 1e-6;
    c.vocab_size = 151936, c.hidden_size = 2048, c.intermediate_size = 6144, c.num_hidden_layers = 48;
    c.num_attention_heads = 32, c.num_key_value_heads = 4, c.head_dim = 128, c.max_position_embeddings = 40960;
    c.rope_theta = 1000000.0;
    c.qk_norm = true;
    MoeConfig& m = c.moe;
    m.n_routed_experts = 128, m.num_experts_per_tok = 8, m.moe_intermediate_size = 768;
    m.norm_topk_prob = true, m.norm_single = true;
    m.layers.assign(static_cast<size_t>(c.num_hidden_layers), 1);
  } else if (name == "tiny") {
    c.vocab_size = 259, c.hidden_size = 256, c.intermediate_size = 640, c.num_hidden_layers = 8;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64, c.max_position_embeddings = 1024;
  } else {
    SPECULA_CHECK(false,
                  "synthetic model '{}' is not known; known: llama3-8b, llama3.2-1b, deepseek-v2-lite, "
                  "deepseek-v2-lite-dense, qwen3-30b-a3b, tiny",
                  name);
  }
  c.eos_token_ids = {};
  c.layer_sliding_window.assign(static_cast<size_t>(c.num_hidden_layers), -1);
  return c;
}

SyntheticWeights::SyntheticWeights(const ModelConfig& config, uint64_t seed) : config_(config), seed_(seed) {}

bool SyntheticWeights::contains(const std::string&) const { return true; }

namespace {

// out[i] = the value of tensor `name` at flat index index(i), i < n, on every core for large n.
template <typename Index>
void fill_values(uint64_t seed, const std::string& name, const Shape& shape, uint16_t* out, int64_t n,
                 const Index& index) {
  const bool norm = name.find("norm") != std::string::npos;
  const float scale = norm ? 0.05f : 1.0f / std::sqrt(static_cast<float>(shape[shape.rank() - 1]));
  const uint64_t base = mix(seed ^ std::hash<std::string>{}(name));
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Uniform in [-sqrt(3), sqrt(3)): unit variance.
      const double u = uniform(base + static_cast<uint64_t>(index(i)));
      const float v = static_cast<float>((u * 2.0 - 1.0) * 1.7320508) * scale + (norm ? 1.0f : 0.0f);
      out[i] = float_to_bf16_bits(v);
    }
  };
  // Each value depends on its index alone: large tensors (an 8B model's 16 GB) are made on every
  // core, the same values whatever their number.
  const int64_t workers = n < (int64_t{1} << 20) ? 1 : std::max<int64_t>(1, std::thread::hardware_concurrency());
  std::vector<std::jthread> threads;
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(fill, n * w / workers, n * (w + 1) / workers);
  fill(0, n / workers);
}

}  // namespace

TensorView SyntheticWeights::get(const std::string& name, const Shape& shape) const {
  scratch_ = Buffer(DType::bf16, shape);
  fill_values(seed_, name, shape, scratch_.data_as<uint16_t>(), shape.numel(), [](int64_t i) { return i; });
  return scratch_.view();
}

void SyntheticWeights::read_slice(const std::string& name, const Shape& shape, int dim, int64_t begin, int64_t end,
                                  Buffer& out) const {
  const int last = shape.rank() - 1;
  SPECULA_CHECK((dim == 0 || dim == last) && begin >= 0 && begin <= end && end <= shape[dim],
                "slice [{}, {}) of dimension {} of {} {} is not valid", begin, end, dim, name, shape.str());
  Shape part = shape;
  part[dim] = end - begin;
  out = Buffer(DType::bf16, part);
  auto* values = out.data_as<uint16_t>();
  if (dim == 0) {
    const int64_t offset = shape[0] > 0 ? begin * (shape.numel() / shape[0]) : 0;
    fill_values(seed_, name, shape, values, part.numel(), [offset](int64_t i) { return offset + i; });
  } else {
    const int64_t width = shape[last], part_width = end - begin;
    fill_values(seed_, name, shape, values, part.numel(), [=](int64_t i) {
      return (i / part_width) * width + begin + i % part_width;
    });
  }
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
  size_t params = static_cast<size_t>(c.vocab_size) * h * (c.tie_word_embeddings ? 1 : 2) + h;
  const MoeConfig& m = c.moe;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const size_t experts = static_cast<size_t>(m.n_routed_experts) + static_cast<size_t>(m.n_shared_experts);
    const size_t mlp = m.is_moe_layer(l) ? 3 * h * static_cast<size_t>(m.moe_intermediate_size) * experts +
                                               h * static_cast<size_t>(m.n_routed_experts)
                                         : 3 * h * static_cast<size_t>(c.intermediate_size);
    params += 2 * h + attention + mlp;
  }
  return params * 2;  // bf16
}

size_t SyntheticWeights::routed_expert_bytes() const {
  const MoeConfig& m = config_.moe;
  size_t params = 0;
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    if (m.is_moe_layer(l)) {
      params += 3 * static_cast<size_t>(config_.hidden_size) * static_cast<size_t>(m.moe_intermediate_size) *
                static_cast<size_t>(m.n_routed_experts);
    }
  }
  return params * 2;  // bf16
}

Eagle3HeadConfig synthetic_eagle3_head_config(const ModelConfig& target) {
  SPECULA_CHECK(!target.is_mla(), "an EAGLE-3 head needs a Llama-family target; '{}' has MLA attention",
                target.architecture);
  SPECULA_CHECK(target.vocab_size >= 2, "an EAGLE-3 head needs a target vocabulary of at least 2 tokens, not {}",
                target.vocab_size);
  Eagle3HeadConfig head;
  ModelConfig& c = head.config;
  c.architecture = "LlamaForCausalLMEagle3";
  c.model_type = "llama";
  // The published heads copy the target's layer shape (Llama-3.1-8B: 4096 hidden, 32 / 8 heads of
  // 128, 14336 intermediate, eps 1e-5) and must rotate positions exactly as the target does.
  c.vocab_size = target.vocab_size;
  c.hidden_size = target.hidden_size;
  c.intermediate_size = target.intermediate_size;
  c.num_hidden_layers = 1;
  c.num_attention_heads = target.num_attention_heads;
  c.num_key_value_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.max_position_embeddings = target.max_position_embeddings;
  c.rms_norm_eps = target.rms_norm_eps;
  c.rope_theta = target.rope_theta;
  c.rope_scaling = target.rope_scaling;
  c.torch_dtype = target.torch_dtype;
  c.eos_token_ids = {};
  c.layer_sliding_window = {-1};
  head.target_hidden_size = target.hidden_size;
  head.capture_layers = default_eagle3_capture_layers(target.num_hidden_layers);
  // 32000 of Llama-3's 128256 ids in the published head; half the vocabulary of a small target,
  // so that d2t is not the identity.
  head.draft_vocab_size = std::min(32000, target.vocab_size / 2);
  return head;
}

SyntheticEagle3Weights::SyntheticEagle3Weights(const Eagle3HeadConfig& head, uint64_t seed)
    : random_(head.config, seed) {
  const ModelConfig& c = head.config;
  const int64_t h = c.hidden_size, th = head.target_hidden_size, inter = c.intermediate_size;
  const int64_t q_out = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  const int64_t kv_out = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
  const int64_t draft = head.draft_vocab_size, vocab = c.vocab_size;
  SPECULA_CHECK(draft >= 1 && draft <= vocab, "the EAGLE-3 head's draft_vocab_size {} is not in [1, {}]", draft, vocab);
  shapes_ = {{"fc.weight", {h, 3 * th}},
             {"midlayer.input_layernorm.weight", {h}},
             {"midlayer.hidden_norm.weight", {h}},
             {"midlayer.self_attn.q_proj.weight", {q_out, 2 * h}},
             {"midlayer.self_attn.k_proj.weight", {kv_out, 2 * h}},
             {"midlayer.self_attn.v_proj.weight", {kv_out, 2 * h}},
             {"midlayer.self_attn.o_proj.weight", {h, q_out}},
             {"midlayer.post_attention_layernorm.weight", {h}},
             {"midlayer.mlp.gate_proj.weight", {inter, h}},
             {"midlayer.mlp.up_proj.weight", {inter, h}},
             {"midlayer.mlp.down_proj.weight", {h, inter}},
             {"norm.weight", {h}},
             {"lm_head.weight", {draft, h}},
             {"d2t", {draft}}};
  // Selection sampling: target id t joins with probability (ids still needed) / (ids left), which
  // gives `draft` distinct ids in increasing order, so every offset t - i is >= 0.
  d2t_ = Buffer(DType::i64, {draft});
  auto* d2t = d2t_.data_as<int64_t>();
  const uint64_t base = mix(seed ^ std::hash<std::string>{}("d2t"));
  int64_t taken = 0;
  for (int64_t t = 0; t < vocab && taken < draft; ++t) {
    if (uniform(base + static_cast<uint64_t>(t)) * static_cast<double>(vocab - t) < static_cast<double>(draft - taken)) {
      d2t[taken] = t - taken;
      ++taken;
    }
  }
  SPECULA_ASSERT(taken == draft);
}

bool SyntheticEagle3Weights::contains(const std::string& name) const { return shapes_.count(name) != 0; }

TensorView SyntheticEagle3Weights::get(const std::string& name, const Shape& shape) const {
  const auto it = shapes_.find(name);
  SPECULA_CHECK(it != shapes_.end(), "the synthetic EAGLE-3 head has no tensor '{}'", name);
  SPECULA_CHECK(it->second == shape, "tensor '{}' has shape {}; the config needs {}", name, it->second.str(), shape.str());
  if (name == "d2t") return d2t_.view();
  return random_.get(name, shape);
}

size_t SyntheticEagle3Weights::total_bytes() const {
  size_t total = d2t_.nbytes();
  for (const auto& [name, shape] : shapes_) {
    if (name != "d2t") total += static_cast<size_t>(shape.numel()) * 2;  // bf16
  }
  return total;
}

}  // namespace specula
