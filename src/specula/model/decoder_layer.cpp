// cpu_decoder_layer: Hugging Face's LlamaDecoderLayer in f32 (and its Qwen / Gemma-2 / MoE variants).
#include "specula/model/decoder_layer.h"

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"
#include "specula/model/cpu_ops.h"

namespace specula {

size_t DecoderLayerWeights::floats() const {
  size_t n = 0;
  for (const auto* v : {&input_norm, &post_norm, &post_attn_norm, &post_ffn_norm, &wq, &wk, &wv, &wo, &bq, &bk, &bv,
                        &bo, &b_gate, &b_up, &b_down, &q_norm, &k_norm, &w_gate, &w_up, &w_down}) {
    n += v->size();
  }
  return n + moe.floats();
}

namespace {
// buffer as f32 [n, heads, head_dim], reallocated only when the shape changes.
Buffer& shaped(Buffer& buffer, int64_t n, int heads, int head_dim) {
  if (buffer.data() == nullptr || !(buffer.shape() == Shape{n, heads, head_dim})) {
    buffer = Buffer(DType::f32, {n, heads, head_dim});
  }
  return buffer;
}
}  // namespace

void cpu_decoder_layer(const DecoderLayerWeights& w, const DecoderLayerDims& d, int64_t n, const float* attn_input,
                       std::vector<float>& x, const CpuRope& rope, const CpuAttend& attend, CpuLayerScratch& scratch,
                       const DualChunkRopes* dual_chunk) {
  const int h = d.hidden, D = d.head_dim, Hq = d.num_q_heads, Hkv = d.num_kv_heads, inter = d.intermediate;
  Buffer& q = shaped(scratch.q, n, Hq, D);
  Buffer& k = shaped(scratch.k, n, Hkv, D);
  Buffer& v = shaped(scratch.v, n, Hkv, D);
  Buffer& attn = shaped(scratch.attn, n, Hq, D);
  cpu_linear(attn_input, w.wq, q.data_as<float>(), n, d.attn_in, Hq * D);
  cpu_linear(attn_input, w.wk, k.data_as<float>(), n, d.attn_in, Hkv * D);
  cpu_linear(attn_input, w.wv, v.data_as<float>(), n, d.attn_in, Hkv * D);
  if (!w.bq.empty()) {
    cpu_add_bias(q.data_as<float>(), w.bq, n);
    cpu_add_bias(k.data_as<float>(), w.bk, n);
    cpu_add_bias(v.data_as<float>(), w.bv, n);
  }
  if (!w.q_norm.empty()) {
    cpu_rms_norm(q.data_as<float>(), w.q_norm, q.data_as<float>(), n * Hq, D, d.eps);
    cpu_rms_norm(k.data_as<float>(), w.k_norm, k.data_as<float>(), n * Hkv, D, d.eps);
  }
  if (dual_chunk != nullptr) {
    // Three (five) copies of each query head side by side, each turned to its own positions.
    SPECULA_ASSERT((dual_chunk->successive_estimate == nullptr) == (dual_chunk->inter_estimate == nullptr));
    const int V = dual_chunk->successive_estimate != nullptr ? 5 : 3;
    Buffer& q3 = shaped(scratch.q3, n, Hq, V * D);
    const float* src = q.data_as<float>();
    float* dst = q3.data_as<float>();
    for (int64_t r = 0; r < n * Hq; ++r) {
      for (int variant = 0; variant < V; ++variant) std::copy_n(src + r * D, D, dst + (r * V + variant) * D);
    }
    const int64_t token_stride = static_cast<int64_t>(Hq) * V * D;
    dual_chunk->intra->apply(dst, Hq, token_stride, V * D, false);
    dual_chunk->successive->apply(dst + D, Hq, token_stride, V * D, false);
    dual_chunk->inter->apply(dst + 2 * D, Hq, token_stride, V * D, false);
    if (V == 5) {
      dual_chunk->successive_estimate->apply(dst + 3 * D, Hq, token_stride, V * D, false);
      dual_chunk->inter_estimate->apply(dst + 4 * D, Hq, token_stride, V * D, false);
    }
    dual_chunk->key->apply(k.data_as<float>(), Hkv);
    if (dual_chunk->key_scale != nullptr) {
      float* kd = k.data_as<float>();
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < static_cast<int64_t>(Hkv) * D; ++i) kd[t * Hkv * D + i] *= dual_chunk->key_scale[t];
      }
    }
    attend(q3, k, v, attn);
  } else {
    rope.apply(q.data_as<float>(), Hq);
    rope.apply(k.data_as<float>(), Hkv);
    attend(q, k, v, attn);
  }
  std::vector<float>& o = scratch.o;
  std::vector<float>& xn = scratch.xn;
  o.resize(static_cast<size_t>(n * h));
  xn.resize(o.size());
  cpu_linear(attn.data_as<float>(), w.wo, o.data(), n, Hq * D, h);
  if (!w.bo.empty()) cpu_add_bias(o.data(), w.bo, n);
  if (!w.post_attn_norm.empty()) cpu_rms_norm(o.data(), w.post_attn_norm, o.data(), n, h, d.eps);
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  cpu_rms_norm(x.data(), w.post_norm, xn.data(), n, h, d.eps);
  if (w.moe.layer) {
    SPECULA_CHECK(d.moe != nullptr, "a mixture-of-experts layer needs its routing (DecoderLayerDims::moe)");
    cpu_moe(*d.moe, w.moe, xn.data(), n, h, o.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    return;
  }
  std::vector<float>& gate = scratch.gate;
  std::vector<float>& up = scratch.up;
  gate.resize(static_cast<size_t>(n * inter));
  up.resize(gate.size());
  cpu_linear(xn.data(), w.w_gate, gate.data(), n, h, inter);
  cpu_linear(xn.data(), w.w_up, up.data(), n, h, inter);
  if (!w.b_gate.empty()) {
    cpu_add_bias(gate.data(), w.b_gate, n);
    cpu_add_bias(up.data(), w.b_up, n);
  }
  if (d.gelu) {
    for (size_t i = 0; i < gate.size(); ++i) {
      const float g = gate[i];
      gate[i] = 0.5f * g * (1.0f + std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
    }
  } else {
    cpu_silu_mul(gate, up);
  }
  cpu_linear(gate.data(), w.w_down, o.data(), n, inter, h);
  if (!w.b_down.empty()) cpu_add_bias(o.data(), w.b_down, n);
  if (!w.post_ffn_norm.empty()) cpu_rms_norm(o.data(), w.post_ffn_norm, o.data(), n, h, d.eps);
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
}

}  // namespace specula
