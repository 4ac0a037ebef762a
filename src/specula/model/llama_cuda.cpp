// LlamaCudaModel: upload, then the decoder step as a sequence of cuBLAS and element-wise launches
// on the legacy default stream (the attention backend's stream when none is given).
#include "specula/model/llama_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cmath>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/model/cuda/model_ops.h"

namespace specula {

namespace ck = cuda_kernels;

namespace {
Buffer upload(const std::vector<float>& v, Device device) {
  if (v.empty()) return {};
  Buffer b(DType::f32, {static_cast<int64_t>(v.size())}, device);
  copy(b, TensorView(const_cast<float*>(v.data()), DType::f32, {static_cast<int64_t>(v.size())}));
  return b;
}
}  // namespace

LlamaCudaModel::LlamaCudaModel(const LlamaModel& host, Device device) : host_(host), device_(device) {
  SPECULA_CHECK(device.is_cuda(), "LlamaCudaModel needs a CUDA device, not {}", device.str());
  CUDA_CHECK(cudaSetDevice(device.index));
  cublasHandle_t handle = nullptr;
  SPECULA_CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed on {}", device.str());
  // Plain f32 arithmetic: TF32 would round the inputs to 10 mantissa bits.
  cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);
  cublas_ = handle;
  embed_ = upload(host.embedding(), device);
  final_norm_ = upload(host.final_norm(), device);
  if (&host.lm_head() != &host.embedding()) lm_head_ = upload(host.lm_head(), device);
  inv_freq_ = upload(host.inv_freq(), device);
  for (const LlamaModel::Layer& l : host.layers()) {
    Layer d;
    d.input_norm = upload(l.input_norm, device);
    d.post_norm = upload(l.post_norm, device);
    d.post_attn_norm = upload(l.post_attn_norm, device);
    d.post_ffn_norm = upload(l.post_ffn_norm, device);
    d.wq = upload(l.wq, device);
    d.wk = upload(l.wk, device);
    d.wv = upload(l.wv, device);
    d.wo = upload(l.wo, device);
    d.bq = upload(l.bq, device);
    d.bk = upload(l.bk, device);
    d.bv = upload(l.bv, device);
    d.bo = upload(l.bo, device);
    d.b_gate = upload(l.b_gate, device);
    d.b_up = upload(l.b_up, device);
    d.b_down = upload(l.b_down, device);
    d.q_norm = upload(l.q_norm, device);
    d.k_norm = upload(l.k_norm, device);
    d.w_gate = upload(l.w_gate, device);
    d.w_up = upload(l.w_up, device);
    d.w_down = upload(l.w_down, device);
    layers_.push_back(std::move(d));
  }
}

LlamaCudaModel::~LlamaCudaModel() {
  if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
}

Buffer& LlamaCudaModel::scratch(size_t slot, DType dtype, int64_t elements) {
  SPECULA_ASSERT(slot < kScratchSlots);
  Buffer& b = scratch_[slot];
  if (b.data() == nullptr || b.dtype() != dtype || b.numel() < elements) b = Buffer(dtype, {std::max<int64_t>(elements, 1)}, device_);
  return b;
}

void LlamaCudaModel::linear(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out) {
  // Row-major y = x w^T is column-major y^T = w x^T, with w read transposed.
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status = cublasSgemm(static_cast<cublasHandle_t>(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, out,
                                            static_cast<int>(n), in, &alpha, w.data_as<const float>(), in, x, in, &beta, y, out);
  SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cublasSgemm failed with status {}", static_cast<int>(status));
  if (bias.data() != nullptr) ck::add_bias_rows(y, bias.data_as<const float>(), n, out, nullptr);
}

void LlamaCudaModel::forward(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits, bool all_tokens) {
  const ModelConfig& c = host_.config();
  const int64_t n = batch.num_tokens();
  const int h = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int inter = c.intermediate_size;
  SPECULA_CHECK(static_cast<int64_t>(batch.input_ids.size()) == n && static_cast<int64_t>(batch.positions.size()) == n,
                "batch has {} tokens but {} input_ids and {} positions", n, batch.input_ids.size(), batch.positions.size());
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
  Buffer& ids = scratch(0, DType::i32, n);
  Buffer& pos = scratch(1, DType::i32, n);
  copy(ids.view().slice(0, n), TensorView(const_cast<int32_t*>(batch.input_ids.data()), DType::i32, {n}));
  copy(pos.view().slice(0, n), TensorView(const_cast<int32_t*>(batch.positions.data()), DType::i32, {n}));
  float* x = scratch(2, DType::f32, n * h).data_as<float>();
  float* xn = scratch(3, DType::f32, n * h).data_as<float>();
  float* q = scratch(4, DType::f32, n * Hq * D).data_as<float>();
  float* k = scratch(5, DType::f32, n * Hkv * D).data_as<float>();
  float* v = scratch(6, DType::f32, n * Hkv * D).data_as<float>();
  float* o = scratch(7, DType::f32, n * h).data_as<float>();
  float* gate = scratch(8, DType::f32, n * inter).data_as<float>();
  float* up = scratch(9, DType::f32, n * inter).data_as<float>();
  float* attn = scratch(10, DType::f32, n * Hq * D).data_as<float>();
  Buffer& qb = scratch(11, DType::bf16, n * Hq * D);
  Buffer& kb = scratch(12, DType::bf16, n * Hkv * D);
  Buffer& vb = scratch(13, DType::bf16, n * Hkv * D);
  Buffer& ab = scratch(14, DType::bf16, n * Hq * D);
  const TensorView q_view(qb.data(), DType::bf16, {n, Hq, D}, device_);
  const TensorView k_view(kb.data(), DType::bf16, {n, Hkv, D}, device_);
  const TensorView v_view(vb.data(), DType::bf16, {n, Hkv, D}, device_);
  const TensorView a_view(ab.data(), DType::bf16, {n, Hq, D}, device_);
  const float eps = static_cast<float>(c.rms_norm_eps);

  ck::embed_rows(embed_.data_as<const float>(), ids.data_as<const int32_t>(), x, n, h,
                 c.gemma2 ? std::sqrt(static_cast<float>(h)) : 1.0f, nullptr);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    ck::rms_norm_rows(x, w.input_norm.data_as<const float>(), xn, n, h, eps, nullptr);
    linear(xn, w.wq, w.bq, q, n, h, Hq * D);
    linear(xn, w.wk, w.bk, k, n, h, Hkv * D);
    linear(xn, w.wv, w.bv, v, n, h, Hkv * D);
    if (w.q_norm.data() != nullptr) {
      ck::rms_norm_rows(q, w.q_norm.data_as<const float>(), q, n * Hq, D, eps, nullptr);
      ck::rms_norm_rows(k, w.k_norm.data_as<const float>(), k, n * Hkv, D, eps, nullptr);
    }
    ck::rope_rows(q, pos.data_as<const int32_t>(), inv_freq_.data_as<const float>(), host_.rope_attention_factor(), n, Hq, D, nullptr);
    ck::rope_rows(k, pos.data_as<const int32_t>(), inv_freq_.data_as<const float>(), host_.rope_attention_factor(), n, Hkv, D, nullptr);
    ck::f32_to_bf16(q, qb.data(), n * Hq * D, nullptr);
    ck::f32_to_bf16(k, kb.data(), n * Hkv * D, nullptr);
    ck::f32_to_bf16(v, vb.data(), n * Hkv * D, nullptr);
    backend.forward(q_view, k_view, v_view, a_view, host_.attention_layers()[l], batch);
    ck::bf16_to_f32(ab.data(), attn, n * Hq * D, nullptr);
    linear(attn, w.wo, w.bo, o, n, Hq * D, h);
    if (w.post_attn_norm.data() != nullptr) ck::rms_norm_rows(o, w.post_attn_norm.data_as<const float>(), o, n, h, eps, nullptr);
    ck::add_inplace(x, o, n * h, nullptr);
    ck::rms_norm_rows(x, w.post_norm.data_as<const float>(), xn, n, h, eps, nullptr);
    linear(xn, w.w_gate, w.b_gate, gate, n, h, inter);
    linear(xn, w.w_up, w.b_up, up, n, h, inter);
    ck::gated_activation(gate, up, n * inter, c.hidden_act == "gelu_pytorch_tanh", nullptr);
    linear(gate, w.w_down, w.b_down, o, n, inter, h);
    if (w.post_ffn_norm.data() != nullptr) ck::rms_norm_rows(o, w.post_ffn_norm.data_as<const float>(), o, n, h, eps, nullptr);
    ck::add_inplace(x, o, n * h, nullptr);
  }
  std::vector<int32_t> rows;
  if (all_tokens) {
    for (int64_t t = 0; t < n; ++t) rows.push_back(static_cast<int32_t>(t));
  } else {
    int32_t end = 0;
    for (int r = 0; r < batch.batch_size; ++r) {
      end += batch.query_len(r);
      rows.push_back(end - 1);
    }
  }
  const auto count = static_cast<int64_t>(rows.size());
  Buffer& row_ids = scratch(15, DType::i32, count);
  copy(row_ids.view().slice(0, count), TensorView(rows.data(), DType::i32, {count}));
  float* selected = scratch(16, DType::f32, count * h).data_as<float>();
  ck::gather_rows(x, row_ids.data_as<const int32_t>(), selected, count, h, nullptr);
  ck::rms_norm_rows(selected, final_norm_.data_as<const float>(), selected, count, h, eps, nullptr);
  Buffer& out = scratch(17, DType::f32, count * c.vocab_size);
  linear(selected, lm_head_.data() != nullptr ? lm_head_ : embed_, Buffer{}, out.data_as<float>(), count, h, c.vocab_size);
  if (c.final_logit_softcapping > 0) ck::softcap(out.data_as<float>(), count * c.vocab_size, static_cast<float>(c.final_logit_softcapping), nullptr);
  logits.resize(static_cast<size_t>(count * c.vocab_size));
  copy(TensorView(logits.data(), DType::f32, {count * c.vocab_size}), out.view().slice(0, count * c.vocab_size));
}

}  // namespace specula
