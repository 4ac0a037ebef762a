// DeepseekCudaModel: upload, then the decoder step as cuBLAS products, the MLA kernels of
// model/cuda/mla_ops, the shared element-wise kernels and the MLA backend, on the model's stream.
#include "specula/model/deepseek_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_graph.h"
#include "specula/core/error.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/fused_ops.h"
#include "specula/model/cuda/mla_absorb.h"
#include "specula/model/cuda/mla_expand.h"
#include "specula/model/cuda/mla_ops.h"
#include "specula/model/cuda/model_ops.h"
#include "specula/model/cuda/step_io.h"
#include "specula/parallel/tp_comm.h"

namespace specula {

namespace ck = cuda_kernels;

DeepseekCudaModel::DeepseekCudaModel(std::unique_ptr<DeepseekModel> host, const ModelOptions& options,
                                     const WeightSource* experts)
    : CudaDecoderExecutor(std::move(host), options.device, false, options.vocab_begin, options.vocab_end,
                          options.tp_comm, options.nonblocking_stream) {
  const Device device = device_;
  const ModelConfig& c = model().config();
  for (size_t i = 0; i < model().layers().size(); ++i) {
    const DeepseekModel::Layer& l = model().layers()[i];
    Layer d;
    d.input_norm = upload_f32(l.input_norm, device);
    d.post_norm = upload_f32(l.post_norm, device);
    // Both down-projections read the same normalised x: one product.
    d.w_in = upload_weight(stack_rows({l.wq.empty() ? &l.wq_a : &l.wq, &l.wkv_a}), device);
    d.q_a_norm = upload_f32(l.q_a_norm, device);
    d.wq_b = upload_weight(l.wq_b, device);
    d.kv_a_norm = upload_f32(l.kv_a_norm, device);
    d.wkv_b = upload_f32(l.wkv_b, device);
    d.wkv_b_bf16 = upload_bf16(l.wkv_b, device);
    d.wo = upload_weight(l.wo, device);
    d.w_gate_up = upload_weight(stack_rows({&l.w_gate, &l.w_up}), device);
    d.w_down = upload_weight(l.w_down, device);
    if (l.is_moe) {
      d.moe = std::make_unique<CudaMoe>(c.moe, l.moe, experts, "model.layers." + std::to_string(i) + ".", c.hidden_size,
                                        device, options.fp8_experts);
    }
    layers_.push_back(std::move(d));
  }
  backend_ = make_deepseek_backend(model(), options, stream_);
}

DeepseekCudaModel::~DeepseekCudaModel() { backend_.reset(); }

size_t DeepseekCudaModel::layer_bytes() const {
  auto held = [](const Buffer& b) { return b.data() != nullptr ? b.nbytes() : 0; };
  size_t bytes = 0;
  for (const Layer& l : layers_) {
    for (const Buffer* b : {&l.input_norm, &l.post_norm, &l.w_in, &l.q_a_norm, &l.wq_b, &l.kv_a_norm, &l.wkv_b,
                            &l.wkv_b_bf16, &l.wo, &l.w_gate_up, &l.w_down}) {
      bytes += held(*b);
    }
    if (l.moe != nullptr) bytes += l.moe->bytes();
  }
  return bytes;
}

size_t DeepseekCudaModel::decode_unread_bytes() const {
  size_t bytes = 0;
  // Decode's absorbed products read kv_b_proj's f32 copy; the bf16 one serves the expanded form.
  for (const Layer& l : layers_) bytes += (l.moe != nullptr ? l.moe->unread_bytes() : 0) + l.wkv_b_bf16.nbytes();
  return bytes;
}

void DeepseekCudaModel::run_layers(const ForwardBatch& batch, Workspace& ws, int64_t n, HiddenCapture* capture) {
  SPECULA_ASSERT(capture == nullptr);
  MlaAttentionBackend& backend = *backend_;
  const CudaStepLinear linear = step_linear(ws);
  const ModelConfig& c = model().config();
  const MlaConfig& m = c.mla;
  const auto s = static_cast<cudaStream_t>(stream_);
  const int h = c.hidden_size, H = c.num_attention_heads, R = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  const int nope = m.qk_nope_head_dim, qk = nope + rope, vd = m.v_head_dim, inter = c.intermediate_size;
  const int q_width = m.q_lora_rank > 0 ? m.q_lora_rank : H * qk, in_width = q_width + R + rope;
  const float eps = static_cast<float>(c.rms_norm_eps);

  const int32_t* ids = scratch(ws, kIds, DType::i32, n).data_as<const int32_t>();
  const int32_t* pos = scratch(ws, kPositions, DType::i32, n).data_as<const int32_t>();
  float* x = scratch(ws, kX, DType::f32, n * h).data_as<float>();
  float* xn = scratch(ws, kXn, DType::f32, n * h).data_as<float>();
  float* in = scratch(ws, kIn, DType::f32, n * in_width).data_as<float>();
  float* qa = m.q_lora_rank > 0 ? scratch(ws, kQa, DType::f32, n * m.q_lora_rank).data_as<float>() : nullptr;
  float* q = m.q_lora_rank > 0 ? scratch(ws, kQ, DType::f32, n * H * qk).data_as<float>() : in;
  const int64_t q_stride = m.q_lora_rank > 0 ? static_cast<int64_t>(H) * qk : in_width;
  float* q_latent = scratch(ws, kQLatent, DType::f32, n * H * R).data_as<float>();
  Buffer& q_abs = scratch(ws, kQAbs, DType::bf16, n * H * (R + rope));
  Buffer& kv_c = scratch(ws, kKvC, DType::f32, n * R);
  Buffer& k_pe = scratch(ws, kKPe, DType::f32, n * rope);
  Buffer& out = scratch(ws, kOut, DType::bf16, n * H * R);
  float* out_f32 = scratch(ws, kOutF32, DType::f32, n * H * R).data_as<float>();
  float* values = scratch(ws, kValues, DType::f32, n * H * vd).data_as<float>();
  float* o = scratch(ws, kO, DType::f32, n * h).data_as<float>();
  float* gate_up = scratch(ws, kGateUp, DType::f32, n * 2 * inter).data_as<float>();
  float* act = scratch(ws, kAct, DType::f32, n * inter).data_as<float>();
  const TensorView q_view(q_abs.data(), DType::bf16, {n, H, R + rope}, device_);
  const TensorView kv_c_view(kv_c.data(), DType::f32, {n, R}, device_);
  const TensorView k_pe_view(k_pe.data(), DType::f32, {n, rope}, device_);
  const TensorView out_view(out.data(), DType::bf16, {n, H, R}, device_);
  // Chosen by the backend for the whole step (init_forward_metadata).
  const bool expanded = backend.expanded_step();
  // Tensor parallelism: o holds this rank's partial sum of a row-parallel product (o_proj, the
  // MLP's or experts' down_proj). The all-reduce, the residual add and the norm after it are one
  // peer kernel where it serves.
  const auto add_norm = [&](float* part, const float* norm) {
    if (tp_comm_ != nullptr && tp_comm_->all_reduce_add_rms_norm(part, n, h, x, norm, xn, eps, nullptr, 0, s)) return;
    if (tp_comm_ != nullptr) tp_comm_->all_reduce(part, n * h, s);
    ck::add_rms_norm_rows(x, part, norm, xn, n, h, eps, s);
  };

  ends_->embed_rows(ids, x, n, 1.0f, s);
  ck::rms_norm_rows(x, layers_[0].input_norm.data_as<const float>(), xn, n, h, eps, s);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    linear(xn, w.w_in, Buffer{}, in, n, h, in_width);
    if (m.q_lora_rank > 0) {
      ck::rms_norm_strided(in, in_width, w.q_a_norm.data_as<const float>(), qa, m.q_lora_rank, n, m.q_lora_rank,
                           DeepseekModel::kLatentNormEps, s);
      linear(qa, w.wq_b, Buffer{}, q, n, m.q_lora_rank, H * qk);
    }
    const float* wkv_b = w.wkv_b.data_as<const float>();
    const int64_t head_rows = static_cast<int64_t>(nope + vd) * R;  // kv_b_proj floats per head
    // A few tokens: the products in kernels of their own (mla_absorb.h), the second reading the
    // attention's bf16 output; more: cuBLAS's batched GEMM.
    const bool absorb_kernels = n > 0 && !expanded && ck::mla_absorb_fits(n, H, nope, vd, R);
    if (absorb_kernels) {
      ck::mla_absorb_uk(q, q_stride, qk, wkv_b, q_latent, n, H, nope, vd, R, s);
    } else if (n > 0 && !expanded) {
      // Absorption: q_latent[:, h] = q_nope[:, h] W_UK[h].
      linear_->batched({q, q_stride, qk}, {wkv_b, R, head_rows}, false, q_latent, static_cast<int64_t>(H) * R, R, n,
                       nope, R, H);
    }
    ck::rms_norm_strided(in + q_width, in_width, w.kv_a_norm.data_as<const float>(), kv_c.data_as<float>(), R, n, R,
                         DeepseekModel::kLatentNormEps, s);
    ck::MlaPackParams pack{};
    pack.q_latent = expanded ? nullptr : q_latent;
    pack.q = q;
    pack.q_stride = q_stride;
    pack.qk_head_dim = qk;
    pack.q_pe_offset = nope;
    pack.kv_a = in + q_width + R;
    pack.kv_a_stride = in_width;
    pack.positions = pos;
    pack.inv_freq = ends_->inv_freq().data_as<const float>();
    pack.rope_factor = model().rope_attention_factor();
    pack.interleave = m.rope_interleave;
    pack.q_out = q_abs.data();
    pack.k_pe_out = k_pe.data_as<float>();
    pack.n = n;
    pack.heads = H;
    pack.kv_lora_rank = R;
    pack.rope_dim = rope;
    ck::mla_pack(pack, s);
    if (expanded) {
      const auto expand = [&](const void* rows_c, const void* rows_pe, int64_t rows, void* k, void* v) {
        expand_mla_rows(*linear_, w.wkv_b_bf16.data(), rows_c, rows_pe, rows, H, R, nope, rope, vd, k, v, s);
      };
      const TensorView q_exp(q_abs.data(), DType::bf16, {n, H, qk}, device_);
      const TensorView values_bf16(out.data(), DType::bf16, {n, H, vd}, device_);
      backend.forward_expanded(q_exp, kv_c_view, k_pe_view, values_bf16, model().mla_layers()[l], batch, expand,
                               MlaForwardOptions{});
      ck::bf16_to_f32(out.data(), values, n * H * vd, s);
    } else {
      backend.forward(q_view, kv_c_view, k_pe_view, out_view, model().mla_layers()[l], batch, MlaForwardOptions{});
      if (!absorb_kernels) ck::bf16_to_f32(out.data(), out_f32, n * H * R, s);
    }
    if (absorb_kernels) {
      ck::mla_absorb_uv(out.data(), wkv_b, values, n, H, nope, vd, R, s);
    } else if (n > 0 && !expanded) {
      // values[:, h] = o[:, h] W_UV[h]^T.
      linear_->batched({out_f32, static_cast<int64_t>(H) * R, R}, {wkv_b + static_cast<int64_t>(nope) * R, R, head_rows},
                       true, values, static_cast<int64_t>(H) * vd, vd, n, R, vd, H);
    }
    linear(values, w.wo, Buffer{}, o, n, H * vd, h);
    add_norm(o, w.post_norm.data_as<const float>());
    if (w.moe != nullptr) {
      w.moe->forward(xn, o, n, linear, s);
    } else {
      const CudaStepLinear::Split sp = linear.split(w.w_gate_up, n, h, 2 * inter);
      linear_->gated(xn, w.w_gate_up, Buffer{}, act, n, h, inter, false, gate_up, sp.hi, sp.lo, sp.halves);
      linear(act, w.w_down, Buffer{}, o, n, inter, h);
    }
    // The residual add, fused with the next layer's input norm.
    if (l + 1 < layers_.size()) {
      add_norm(o, layers_[l + 1].input_norm.data_as<const float>());
    } else {
      if (tp_comm_ != nullptr) tp_comm_->all_reduce(o, n * h, s);
      ck::add_inplace(x, o, n * h, s);
    }
  }

}

void DeepseekCudaModel::forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) {
  SPECULA_CHECK(r.capture == nullptr, "{}: capturing hidden states for a draft head is not supported",
                model().config().architecture);
  if (r.use_cuda_graph && !r.all_tokens && replay_decode(batch, logits, r)) return;
  eager_forward(batch, logits, r);
}

}  // namespace specula
