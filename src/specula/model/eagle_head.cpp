// EagleHead: loading (format detection, checks against the target) and the f32 forward.
#include "specula/model/eagle_head.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "specula/core/error.h"
#include "specula/core/json_reader.h"
#include "specula/model/cpu_ops.h"
#include "specula/model/rope.h"
#include "specula/model/safetensors.h"

namespace specula {

using json = nlohmann::json;

std::string_view eagle_kind_name(EagleKind kind) { return kind == EagleKind::EAGLE ? "EAGLE" : "EAGLE3"; }

EagleKind parse_eagle_kind(std::string_view name) {
  std::string upper(name);
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (upper == "EAGLE") return EagleKind::EAGLE;
  if (upper == "EAGLE3") return EagleKind::EAGLE3;
  SPECULA_CHECK(false, "speculative algorithm '{}' is not supported; supported: EAGLE, EAGLE3", name);
  return EagleKind::EAGLE;
}

std::vector<int> default_eagle3_capture_layers(int target_layers) {
  const int L = target_layers;
  return {2, L / 2, L - 3};
}

namespace {

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  convert_to_float(t.data(), t.dtype(), out.data(), out.size());
  return out;
}

// Converted at once: a synthetic source's view lives only until its next get.
std::vector<float> load(const WeightSource& weights, const std::string& name, const Shape& shape) {
  return to_f32(weights.get(name, shape));
}

// The head's kind as its files say: the architecture name when it is one of the head names, else
// the tensors (published EAGLE heads often keep `LlamaForCausalLM`).
EagleKind detect_kind(const std::string& architecture, const WeightSource& ckpt) {
  if (architecture == "LlamaForCausalLMEagle3") return EagleKind::EAGLE3;
  if (architecture == "LlamaForCausalLMEagle") return EagleKind::EAGLE;
  if (ckpt.contains("midlayer.self_attn.q_proj.weight")) return EagleKind::EAGLE3;
  SPECULA_CHECK(ckpt.contains("fc.weight"),
                "the draft model (architecture '{}') is not an EAGLE head: it has no 'fc.weight' tensor", architecture);
  return EagleKind::EAGLE;
}

void check_target_hidden(int64_t target_hidden, int64_t th) {
  SPECULA_CHECK(target_hidden == th, "the EAGLE-3 head's target_hidden_size {} does not match the target's hidden_size {}",
                target_hidden, th);
}

}  // namespace

EagleHead::EagleHead(const std::filesystem::path& dir, EagleKind kind, const LlamaModel& target)
    : kind_(kind), target_(target) {
  const auto path = dir / "config.json";
  SPECULA_CHECK(std::filesystem::is_regular_file(path), "cannot read {}: is '{}' a draft model folder?", path.string(),
                dir.string());
  json j = JsonReader::parse_file(path);
  SPECULA_CHECK(j.is_object(), "{} is not a JSON object", path.string());
  std::string architecture = "LlamaForCausalLM";
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    architecture = j["architectures"][0].get<std::string>();
  }
  // The decoder layer is a Llama layer: parse the shape with the Llama rules.
  j["architectures"] = json::array({"LlamaForCausalLM"});
  config_ = parse_model_config(j.dump());
  config_.architecture = architecture;

  const Checkpoint ckpt(dir);
  const EagleKind found = detect_kind(architecture, ckpt);
  SPECULA_CHECK(found == kind, "the draft model in {} is an {} head ({}), but the speculative algorithm is {}",
                dir.string(), eagle_kind_name(found), architecture, eagle_kind_name(kind));

  load_embedding(ckpt);
  const int64_t h = config_.hidden_size, th = target.config().hidden_size;
  if (kind == EagleKind::EAGLE) {
    SPECULA_CHECK(h == th, "the EAGLE head's hidden_size {} does not match the target's {}", h, th);
    feature_size_ = static_cast<int>(th);
    capture_layers_ = {HiddenCapture::kFinalNormed};
    draft_vocab_ = target.config().vocab_size;
    w_.fc = load(ckpt, "fc.weight", {h, 2 * h});
    if (ckpt.contains("fc.bias")) w_.fc_bias = load(ckpt, "fc.bias", {h});
    load_layer(ckpt, ckpt.contains("layers.0.self_attn.q_proj.weight") ? "layers.0." : "model.layers.0.", h);
  } else {
    // config.json's EAGLE-3 fields, each checked as it is read (load_eagle3 checks the rest).
    Eagle3HeadConfig head;  // its config is config_, already set
    const int64_t target_hidden = j.contains("target_hidden_size") && j["target_hidden_size"].is_number_integer()
                                      ? j["target_hidden_size"].get<int64_t>()
                                      : h;
    check_target_hidden(target_hidden, th);
    head.target_hidden_size = static_cast<int>(target_hidden);
    // SGLang's convention: eagle_aux_hidden_state_layer_ids name layer outputs, i.e. the streams
    // entering layers id + 1.
    if (j.contains("eagle_config") && j["eagle_config"].is_object() &&
        j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
      for (const json& x : j["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) {
        SPECULA_CHECK(x.is_number_integer(), "{}: eagle_aux_hidden_state_layer_ids must hold integers", path.string());
        head.capture_layers.push_back(x.get<int>() + 1);
      }
    } else {
      head.capture_layers = default_eagle3_capture_layers(target.config().num_hidden_layers);
    }
    head.draft_vocab_size = j.contains("draft_vocab_size") && j["draft_vocab_size"].is_number_integer()
                                ? j["draft_vocab_size"].get<int>()
                                : config_.vocab_size;
    load_eagle3(head, ckpt);
  }
  finish();
}

EagleHead::EagleHead(const Eagle3HeadConfig& head, const WeightSource& weights, const LlamaModel& target)
    : kind_(EagleKind::EAGLE3), config_(head.config), target_(target) {
  load_embedding(weights);
  load_eagle3(head, weights);
  finish();
}

void EagleHead::load_embedding(const WeightSource& weights) {
  const ModelConfig& t = target_.config();
  const int64_t h = config_.hidden_size, th = t.hidden_size;
  SPECULA_CHECK(config_.vocab_size == t.vocab_size,
                "the draft head's vocab_size {} does not match the target's {}", config_.vocab_size, t.vocab_size);
  if (weights.contains("embed_tokens.weight")) {
    w_.embed = load(weights, "embed_tokens.weight", {t.vocab_size, h});
  } else {
    SPECULA_CHECK(h == th, "the draft head's hidden_size {} does not match the target's {} (the head shares its embedding)",
                  h, th);
  }
}

// The decoder layer's attention and MLP weights under `prefix`; q/k/v read attn_in features.
void EagleHead::load_layer(const WeightSource& weights, const std::string& prefix, int64_t attn_in) {
  const std::string& p = prefix;
  const int64_t h = config_.hidden_size;
  const int64_t q_out = static_cast<int64_t>(config_.num_attention_heads) * config_.head_dim;
  const int64_t kv_out = static_cast<int64_t>(config_.num_key_value_heads) * config_.head_dim;
  const int64_t inter = config_.intermediate_size;
  w_.layer.wq = load(weights, p + "self_attn.q_proj.weight", {q_out, attn_in});
  w_.layer.wk = load(weights, p + "self_attn.k_proj.weight", {kv_out, attn_in});
  w_.layer.wv = load(weights, p + "self_attn.v_proj.weight", {kv_out, attn_in});
  w_.layer.wo = load(weights, p + "self_attn.o_proj.weight", {h, q_out});
  w_.layer.post_norm = load(weights, p + "post_attention_layernorm.weight", {h});
  w_.layer.w_gate = load(weights, p + "mlp.gate_proj.weight", {inter, h});
  w_.layer.w_up = load(weights, p + "mlp.up_proj.weight", {inter, h});
  w_.layer.w_down = load(weights, p + "mlp.down_proj.weight", {h, inter});
}

// The EAGLE-3 checks against the target and tensors; config_ already holds head.config.
void EagleHead::load_eagle3(const Eagle3HeadConfig& head, const WeightSource& weights) {
  const ModelConfig& t = target_.config();
  const int64_t h = config_.hidden_size, th = t.hidden_size;
  check_target_hidden(head.target_hidden_size, th);
  const int L = t.num_hidden_layers;
  const std::vector<int>& ids = head.capture_layers;
  SPECULA_CHECK(ids.size() == 3, "the EAGLE-3 head captures {} target layers; it must be 3", ids.size());
  for (int id : ids) {
    SPECULA_CHECK(id >= 0 && id < L, "the EAGLE-3 head reads the stream entering target layer {}; the target has {} layers",
                  id, L);
  }
  capture_layers_ = ids;
  feature_size_ = static_cast<int>(3 * th);
  draft_vocab_ = head.draft_vocab_size;
  SPECULA_CHECK(draft_vocab_ >= 1 && draft_vocab_ <= t.vocab_size, "the EAGLE-3 head's draft_vocab_size {} is not in [1, {}]",
                draft_vocab_, t.vocab_size);
  w_.fc = load(weights, "fc.weight", {h, 3 * th});
  w_.input_norm = load(weights, "midlayer.input_layernorm.weight", {h});
  w_.hidden_norm = load(weights, "midlayer.hidden_norm.weight", {h});
  load_layer(weights, "midlayer.", 2 * h);
  w_.final_norm = load(weights, "norm.weight", {h});
  w_.lm_head = load(weights, "lm_head.weight", {draft_vocab_, h});
  if (weights.contains("d2t")) {
    const TensorView d2t = weights.get("d2t", {draft_vocab_});
    SPECULA_CHECK(d2t.dtype() == DType::i64, "the EAGLE-3 head's d2t must be int64, not {}", dtype_name(d2t.dtype()));
    const auto* v = static_cast<const int64_t*>(d2t.data());
    w_.d2t.assign(v, v + draft_vocab_);
    for (int i = 0; i < draft_vocab_; ++i) {
      SPECULA_CHECK(i + w_.d2t[static_cast<size_t>(i)] >= 0 && i + w_.d2t[static_cast<size_t>(i)] < t.vocab_size,
                    "the EAGLE-3 head's d2t maps draft id {} to {}, outside the target vocabulary [0, {})", i,
                    i + w_.d2t[static_cast<size_t>(i)], t.vocab_size);
    }
  } else {
    SPECULA_CHECK(draft_vocab_ == t.vocab_size,
                  "the EAGLE-3 head has a draft vocabulary of {} tokens but no d2t mapping to the target's {}",
                  draft_vocab_, t.vocab_size);
    w_.d2t.assign(static_cast<size_t>(draft_vocab_), 0);
  }
}

void EagleHead::finish() {
  attention_layer_.layer_id = 0;
  attention_layer_.num_q_heads = config_.num_attention_heads;
  attention_layer_.num_kv_heads = config_.num_key_value_heads;
  attention_layer_.head_dim = config_.head_dim;
  const RopeFrequencies rope = compute_rope_frequencies(config_);
  inv_freq_ = rope.inv_freq;
  rope_attention_factor_ = rope.attention_factor;
}

int32_t EagleHead::to_target_id(int32_t draft_id) const {
  if (kind_ == EagleKind::EAGLE) return draft_id;
  return static_cast<int32_t>(draft_id + w_.d2t[static_cast<size_t>(draft_id)]);
}

void EagleHead::forward(const ForwardBatch& batch, AttentionBackend& backend, const float* hidden_in, bool from_target,
                        std::vector<float>& hidden_out, const std::vector<int64_t>& logit_rows,
                        std::vector<float>& logits) const {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  const int h = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int vocab = target_.config().vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<float>& embed = w_.embed.empty() ? target_.embedding() : w_.embed;
  std::vector<float> emb(static_cast<size_t>(n * h));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = batch.input_ids[static_cast<size_t>(t)];
    SPECULA_CHECK(id >= 0 && id < vocab, "token id {} is out of range [0, {})", id, vocab);
    std::copy_n(embed.begin() + static_cast<int64_t>(id) * h, h, emb.begin() + t * h);
  }
  // x: the layer's input (EAGLE) / residual (EAGLE-3), [n, h]; a: the attention input.
  std::vector<float> x(static_cast<size_t>(n * h));
  std::vector<float> a;
  int attn_in = h;
  if (kind_ == EagleKind::EAGLE) {
    SPECULA_CHECK(!from_target || feature_size_ == h, "EAGLE features must have {} values per token", h);
    std::vector<float> cat(static_cast<size_t>(n * 2 * h));
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(emb.begin() + t * h, h, cat.begin() + t * 2 * h);
      std::copy_n(hidden_in + t * h, h, cat.begin() + t * 2 * h + h);
    }
    cpu_linear(cat.data(), w_.fc, x.data(), n, 2 * h, h);
    if (!w_.fc_bias.empty()) cpu_add_bias(x.data(), w_.fc_bias, n);
    a = x;  // no input_layernorm
  } else {
    if (from_target) {
      cpu_linear(hidden_in, w_.fc, x.data(), n, feature_size_, h);
    } else {
      std::copy_n(hidden_in, n * h, x.begin());
    }
    attn_in = 2 * h;
    a.resize(static_cast<size_t>(n * 2 * h));
    std::vector<float> normed(static_cast<size_t>(n * h));
    cpu_rms_norm(emb.data(), w_.input_norm, normed.data(), n, h, eps);
    for (int64_t t = 0; t < n; ++t) std::copy_n(normed.begin() + t * h, h, a.begin() + t * 2 * h);
    cpu_rms_norm(x.data(), w_.hidden_norm, normed.data(), n, h, eps);
    for (int64_t t = 0; t < n; ++t) std::copy_n(normed.begin() + t * h, h, a.begin() + t * 2 * h + h);
  }
  const CpuRope rope(batch.positions, inv_freq_, rope_attention_factor_);
  const DecoderLayerDims dims{h, attn_in, Hq, Hkv, D, c.intermediate_size, eps, false};
  CpuLayerScratch scratch;
  cpu_decoder_layer(w_.layer, dims, n, a.data(), x, rope,
                    [&](const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
                      backend.forward(q, k, v, out, attention_layer_, batch);
                    },
                    scratch);
  hidden_out = x;

  const auto rows = static_cast<int64_t>(logit_rows.size());
  std::vector<float> selected(static_cast<size_t>(rows * h));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = logit_rows[static_cast<size_t>(r)];
    SPECULA_ASSERT(row >= 0 && row < n);
    std::copy_n(x.begin() + row * h, h, selected.begin() + r * h);
  }
  logits.resize(static_cast<size_t>(rows * draft_vocab_));
  if (rows == 0) return;
  if (kind_ == EagleKind::EAGLE) {
    cpu_linear(selected.data(), target_.lm_head(), logits.data(), rows, h, draft_vocab_);
  } else {
    cpu_rms_norm(selected.data(), w_.final_norm, selected.data(), rows, h, eps);
    cpu_linear(selected.data(), w_.lm_head, logits.data(), rows, h, draft_vocab_);
  }
}

}  // namespace specula
