// LlamaModel on the CPU. The arithmetic follows Hugging Face's LlamaForCausalLM in float32:
// RMSNorm computes in f32 and scales by the weight; RoPE rotates halves (rotate_half) with
// inverse frequencies 1 / theta^(2i/d) computed in f32; SiLU-gated MLP.
#include "specula/model/llama.h"


#include <algorithm>
#include <cmath>
#include <optional>

#include "specula/core/error.h"
#include "specula/attention/cpu/dual_chunk.h"
#include "specula/model/cpu_ops.h"
#include "specula/model/weight_loader.h"

namespace specula {

LlamaModel::LlamaModel(const ModelConfig& c, const WeightSource& ckpt, bool routed_experts, bool layer_matrices)
    : CpuDecoder(c) {
  const int64_t h = c.hidden_size, q_out = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  const int64_t kv_out = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
  F32WeightLoader load(ckpt);
  // Gemma's RMSNorm multiplies by (1 + w): folded into the weights once.
  auto norm = [&](const std::string& name) {
    std::vector<float> w = load(name, {h});
    if (c.gemma2) {
      for (float& x : w) x += 1.0f;
    }
    return w;
  };
  load_ends(load, c.gemma2 ? 1.0f : 0.0f);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer layer;
    layer.input_norm = norm(p + "input_layernorm.weight");
    if (c.gemma2) {
      layer.post_attn_norm = norm(p + "post_attention_layernorm.weight");
      layer.post_norm = norm(p + "pre_feedforward_layernorm.weight");
      layer.post_ffn_norm = norm(p + "post_feedforward_layernorm.weight");
    } else {
      layer.post_norm = norm(p + "post_attention_layernorm.weight");
    }
    if (layer_matrices) {
      layer.wq = load(p + "self_attn.q_proj.weight", {q_out, h});
      layer.wk = load(p + "self_attn.k_proj.weight", {kv_out, h});
      layer.wv = load(p + "self_attn.v_proj.weight", {kv_out, h});
      layer.wo = load(p + "self_attn.o_proj.weight", {h, q_out});
    }
    if (c.attention_bias) {
      layer.bq = load(p + "self_attn.q_proj.bias", {q_out});
      layer.bk = load(p + "self_attn.k_proj.bias", {kv_out});
      layer.bv = load(p + "self_attn.v_proj.bias", {kv_out});
    }
    if (c.o_proj_bias) layer.bo = load(p + "self_attn.o_proj.bias", {h});
    if (c.mlp_bias) {
      layer.b_gate = load(p + "mlp.gate_proj.bias", {c.intermediate_size});
      layer.b_up = load(p + "mlp.up_proj.bias", {c.intermediate_size});
      layer.b_down = load(p + "mlp.down_proj.bias", {h});
    }
    if (c.qk_norm) {
      layer.q_norm = load(p + "self_attn.q_norm.weight", {c.head_dim});
      layer.k_norm = load(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    if (c.moe.is_moe_layer(l)) {
      layer.moe = load_moe_weights(load, p, c, routed_experts);
    } else if (layer_matrices) {
      layer.w_gate = load(p + "mlp.gate_proj.weight", {c.intermediate_size, h});
      layer.w_up = load(p + "mlp.up_proj.weight", {c.intermediate_size, h});
      layer.w_down = load(p + "mlp.down_proj.weight", {h, c.intermediate_size});
    }
    layers_.push_back(std::move(layer));

    AttentionLayer a;
    a.layer_id = l;
    a.num_q_heads = c.num_attention_heads;
    a.num_kv_heads = c.num_key_value_heads;
    a.head_dim = c.head_dim;
    // A window of W tokens lets a query see itself and W - 1 earlier keys.
    const int window = c.layer_sliding_window[static_cast<size_t>(l)];
    a.sliding_window_size = window > 0 ? window - 1 : -1;
    a.logit_cap = static_cast<float>(c.attn_logit_softcapping);
    if (c.query_pre_attn_scalar > 0) a.scaling = static_cast<float>(1.0 / std::sqrt(c.query_pre_attn_scalar));
    if (c.dual_chunk.enabled()) {
      a.dca_chunk_len = c.dual_chunk.chunk_len();
      a.dca_original_max_position = c.dual_chunk.original_max_position_embeddings;
      if (c.dual_chunk.sparse_enabled) {
        auto pattern = std::make_shared<DualChunkSparsePattern>();
        pattern->threshold = c.dual_chunk.sparse_threshold;
        pattern->last_q = c.dual_chunk.sparse_last_q;
        pattern->vertical = c.dual_chunk.sparse_vertical[static_cast<size_t>(l)];
        pattern->slash = c.dual_chunk.sparse_slash[static_cast<size_t>(l)];
        a.dca_sparse = std::move(pattern);
      }
    }
    attention_layers_.push_back(a);
  }
}

size_t LlamaModel::weight_bytes() const {
  size_t floats = ends_floats();
  for (const Layer& l : layers_) floats += l.floats();
  return floats * sizeof(float);
}

std::vector<float> dual_chunk_key_scales(const DualChunkAttentionConfig& config, const ForwardBatch& batch) {
  std::vector<float> scales;
  if (!config.enabled() || config.original_max_position_embeddings <= 0) return scales;
  for (int r = 0; r < batch.batch_size; ++r) {
    const double f = dual_chunk_logit_scale(batch.kv_len(r), config.original_max_position_embeddings);
    scales.insert(scales.end(), static_cast<size_t>(batch.query_len(r)), static_cast<float>(f));
  }
  return scales;
}

void LlamaModel::forward(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits, bool all_tokens,
                         HiddenCapture* capture) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  const int hidden = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  std::vector<float> x;
  embed_tokens(batch, c.gemma2 ? std::sqrt(static_cast<float>(hidden)) : 1.0f, x);
  std::vector<float> xn(x.size());
  const CpuRope rope(batch.positions, inv_freq(), rope_attention_factor());
  // Dual chunk attention: keys at pos % chunk_len; queries at the same (intra), at
  // min(pos % chunk_len + chunk_len, chunk_size) (successive) and at min(2 chunk_len - 1,
  // chunk_size) (inter), as Qwen2.5-1M's DualChunkRotaryEmbedding places them; with a sparse
  // prefill pattern also at pos % chunk_len + chunk_len and pos % chunk_len + chunk_size (the
  // successive and inter positions unclamped, which only estimate the pattern).
  std::vector<int32_t> key_pos, succ_pos, inter_pos, succ_est_pos, inter_est_pos;
  std::vector<float> key_scale;
  std::optional<CpuRope> key_rope, succ_rope, inter_rope, succ_est_rope, inter_est_rope;
  std::optional<DualChunkRopes> dual_chunk;
  if (c.dual_chunk.enabled()) {
    const int cl = c.dual_chunk.chunk_len(), cs = c.dual_chunk.chunk_size;
    for (int32_t p : batch.positions) {
      key_pos.push_back(p % cl);
      succ_pos.push_back(std::min(p % cl + cl, cs));
      inter_pos.push_back(std::min(2 * cl - 1, cs));
      if (c.dual_chunk.sparse_enabled) {
        succ_est_pos.push_back(p % cl + cl);
        inter_est_pos.push_back(p % cl + cs);
      }
    }
    key_rope.emplace(key_pos, inv_freq(), rope_attention_factor());
    succ_rope.emplace(succ_pos, inv_freq(), rope_attention_factor());
    inter_rope.emplace(inter_pos, inv_freq(), rope_attention_factor());
    if (c.dual_chunk.sparse_enabled) {
      succ_est_rope.emplace(succ_est_pos, inv_freq(), rope_attention_factor());
      inter_est_rope.emplace(inter_est_pos, inv_freq(), rope_attention_factor());
    }
    // Keys carry the temperature of their request's length when written; the attention applies
    // the query's at each step.
    key_scale = dual_chunk_key_scales(c.dual_chunk, batch);
    dual_chunk = DualChunkRopes{&*key_rope,
                                &*key_rope,
                                &*succ_rope,
                                &*inter_rope,
                                succ_est_rope ? &*succ_est_rope : nullptr,
                                inter_est_rope ? &*inter_est_rope : nullptr,
                                key_scale.empty() ? nullptr : key_scale.data()};
  }
  const float eps = static_cast<float>(c.rms_norm_eps);
  const DecoderLayerDims dims{hidden, hidden, Hq, Hkv, D, c.intermediate_size, eps, c.hidden_act == "gelu_pytorch_tanh",
                              c.has_moe() ? &c.moe : nullptr};
  const size_t captured = capture != nullptr ? capture->layers.size() : 0;
  if (capture != nullptr) capture->prepare(c.num_hidden_layers, n, hidden);
  // Copies [n, hidden] into capture entry e of every token.
  auto store = [&](size_t e, const float* src) {
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(src + t * hidden, hidden, capture->data.begin() + static_cast<int64_t>((static_cast<size_t>(t) * captured + e) * static_cast<size_t>(hidden)));
    }
  };
  CpuLayerScratch scratch;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    for (size_t e = 0; e < captured; ++e) {
      if (capture->layers[e] == static_cast<int>(l)) store(e, x.data());
    }
    cpu_rms_norm(x.data(), w.input_norm, xn.data(), n, hidden, eps);
    cpu_decoder_layer(w, dims, n, xn.data(), x, rope,
                      [&](const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
                        backend.forward(q, k, v, out, attention_layers_[l], batch);
                      },
                      scratch, dual_chunk ? &*dual_chunk : nullptr);
  }
  for (size_t e = 0; e < captured; ++e) {
    if (capture->layers[e] != HiddenCapture::kFinalNormed) continue;
    cpu_rms_norm(x.data(), final_norm(), xn.data(), n, hidden, eps);
    store(e, xn.data());
  }
  final_logits(x.data(), batch, all_tokens, logits);
  if (c.final_logit_softcapping > 0) {
    const auto cap = static_cast<float>(c.final_logit_softcapping);
    for (float& v : logits) v = cap * std::tanh(v / cap);
  }
}

}  // namespace specula
