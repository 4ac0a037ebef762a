// DeepseekModel on the CPU, in float32 as transformers' DeepseekV2/V3 modules compute it (RMSNorm
// in f32, RoPE over adjacent pairs with f32 angles, SiLU-gated MLPs or experts), with attention
// absorbed.
#include "specula/model/deepseek.h"

#include <algorithm>

#include "specula/core/error.h"
#include "specula/model/cpu_ops.h"
#include "specula/model/weight_loader.h"

namespace specula {

DeepseekModel::DeepseekModel(const ModelConfig& c, const WeightSource& ckpt, bool routed_experts) : CpuDecoder(c) {
  SPECULA_CHECK(c.is_mla(), "{} is not a multi-head latent attention model", c.architecture);
  const MlaConfig& m = c.mla;
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t q_out = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim);
  F32WeightLoader load(ckpt);
  load_ends(load, 0.0f);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer w;
    w.input_norm = load(p + "input_layernorm.weight", {h});
    w.post_norm = load(p + "post_attention_layernorm.weight", {h});
    if (m.q_lora_rank > 0) {
      w.wq_a = load(p + "self_attn.q_a_proj.weight", {m.q_lora_rank, h});
      w.q_a_norm = load(p + "self_attn.q_a_layernorm.weight", {m.q_lora_rank});
      w.wq_b = load(p + "self_attn.q_b_proj.weight", {q_out, m.q_lora_rank});
    } else {
      w.wq = load(p + "self_attn.q_proj.weight", {q_out, h});
    }
    w.wkv_a = load(p + "self_attn.kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, h});
    w.kv_a_norm = load(p + "self_attn.kv_a_layernorm.weight", {m.kv_lora_rank});
    w.wkv_b = load(p + "self_attn.kv_b_proj.weight", {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
    w.wo = load(p + "self_attn.o_proj.weight", {h, heads * m.v_head_dim});
    w.is_moe = c.moe.is_moe_layer(l);
    if (w.is_moe) {
      w.moe = load_moe_weights(load, p, c, routed_experts);
    } else {
      w.w_gate = load(p + "mlp.gate_proj.weight", {c.intermediate_size, h});
      w.w_up = load(p + "mlp.up_proj.weight", {c.intermediate_size, h});
      w.w_down = load(p + "mlp.down_proj.weight", {h, c.intermediate_size});
    }
    layers_.push_back(std::move(w));

    MlaLayer a;
    a.layer_id = l;
    a.num_q_heads = c.num_attention_heads;
    a.kv_lora_rank = m.kv_lora_rank;
    a.qk_rope_head_dim = m.qk_rope_head_dim;
    a.qk_nope_head_dim = m.qk_nope_head_dim;
    a.v_head_dim = m.v_head_dim;
    a.scaling = static_cast<float>(m.softmax_scale);
    mla_layers_.push_back(a);
  }
}

size_t DeepseekModel::weight_bytes() const {
  size_t floats = ends_floats();
  for (const Layer& l : layers_) {
    for (const auto* v : {&l.input_norm, &l.post_norm, &l.wq, &l.wq_a, &l.q_a_norm, &l.wq_b, &l.wkv_a, &l.kv_a_norm,
                          &l.wkv_b, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      floats += v->size();
    }
    floats += l.moe.floats();
  }
  return floats * sizeof(float);
}

void DeepseekModel::forward(const ForwardBatch& batch, MlaAttentionBackend& backend, std::vector<float>& logits,
                            bool all_tokens) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const int64_t n = batch.num_tokens();
  const int hidden = c.hidden_size, H = c.num_attention_heads, R = m.kv_lora_rank, rope_dim = m.qk_rope_head_dim;
  const int nope = m.qk_nope_head_dim, qk = nope + rope_dim, vd = m.v_head_dim, latent = R + rope_dim;
  std::vector<float> x;
  embed_tokens(batch, 1.0f, x);
  std::vector<float> xn(x.size()), o(x.size());
  std::vector<float> q(static_cast<size_t>(n * H * qk)), q_a(static_cast<size_t>(n * m.q_lora_rank));
  std::vector<float> kv_a(static_cast<size_t>(n * latent)), values(static_cast<size_t>(n * H * vd));
  std::vector<float> gate(static_cast<size_t>(n * c.intermediate_size)), up(gate.size());
  Buffer q_abs(DType::f32, {n, H, latent}), kv_c(DType::f32, {n, R}), k_pe(DType::f32, {n, rope_dim});
  Buffer attn(DType::f32, {n, H, R});
  const CpuRope rope(batch.positions, inv_freq(), rope_attention_factor());
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    cpu_rms_norm(x.data(), w.input_norm, xn.data(), n, hidden, eps);
    if (m.q_lora_rank > 0) {
      cpu_linear(xn.data(), w.wq_a, q_a.data(), n, hidden, m.q_lora_rank);
      cpu_rms_norm(q_a.data(), w.q_a_norm, q_a.data(), n, m.q_lora_rank, kLatentNormEps);
      cpu_linear(q_a.data(), w.wq_b, q.data(), n, m.q_lora_rank, H * qk);
    } else {
      cpu_linear(xn.data(), w.wq, q.data(), n, hidden, H * qk);
    }
    cpu_linear(xn.data(), w.wkv_a, kv_a.data(), n, hidden, latent);
    rope.apply(q.data() + nope, H, static_cast<int64_t>(H) * qk, qk, m.rope_interleave);
    rope.apply(kv_a.data() + R, 1, latent, latent, m.rope_interleave);
    float* qa = q_abs.data_as<float>();
    float* c_rows = kv_c.data_as<float>();
    float* pe_rows = k_pe.data_as<float>();
    for (int64_t t = 0; t < n; ++t) {
      cpu_rms_norm(kv_a.data() + t * latent, w.kv_a_norm, c_rows + t * R, 1, R, kLatentNormEps);
      std::copy_n(kv_a.data() + t * latent + R, rope_dim, pe_rows + t * rope_dim);
      for (int hd = 0; hd < H; ++hd) {
        std::copy_n(q.data() + (t * H + hd) * qk + nope, rope_dim, qa + (t * H + hd) * latent + R);
      }
    }
    // Absorption, one product per head: q_abs[:, h, :R] = q_nope[:, h] W_UK[h].
    for (int hd = 0; hd < H; ++hd) {
      const float* w_uk = w.wkv_b.data() + static_cast<int64_t>(hd) * (nope + vd) * R;
      cpu_matmul(q.data() + static_cast<int64_t>(hd) * qk, static_cast<int64_t>(H) * qk, w_uk, R, false,
                 qa + static_cast<int64_t>(hd) * latent, static_cast<int64_t>(H) * latent, n, nope, R);
    }
    backend.forward(q_abs, kv_c, k_pe, attn, mla_layers_[l], batch, MlaForwardOptions{});
    // values[:, h] = o[:, h] W_UV[h]^T, then o_proj.
    for (int hd = 0; hd < H; ++hd) {
      const float* w_uv = w.wkv_b.data() + (static_cast<int64_t>(hd) * (nope + vd) + nope) * R;
      cpu_matmul(attn.data_as<float>() + static_cast<int64_t>(hd) * R, static_cast<int64_t>(H) * R, w_uv, R, true,
                 values.data() + static_cast<int64_t>(hd) * vd, static_cast<int64_t>(H) * vd, n, R, vd);
    }
    cpu_linear(values.data(), w.wo, o.data(), n, H * vd, hidden);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    cpu_rms_norm(x.data(), w.post_norm, xn.data(), n, hidden, eps);
    if (w.is_moe) {
      cpu_moe(c.moe, w.moe, xn.data(), n, hidden, o.data());
    } else {
      gate.resize(static_cast<size_t>(n * c.intermediate_size));
      up.resize(gate.size());
      cpu_linear(xn.data(), w.w_gate, gate.data(), n, hidden, c.intermediate_size);
      cpu_linear(xn.data(), w.w_up, up.data(), n, hidden, c.intermediate_size);
      cpu_silu_mul(gate, up);
      cpu_linear(gate.data(), w.w_down, o.data(), n, c.intermediate_size, hidden);
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  final_logits(x.data(), batch, all_tokens, logits);
}

}  // namespace specula
