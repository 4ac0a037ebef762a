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
#include "specula/model/cuda/mla_expand.h"
#include "specula/model/cuda/mla_ops.h"
#include "specula/model/cuda/model_ops.h"
#include "specula/model/cuda/step_io.h"

namespace specula {

namespace ck = cuda_kernels;

DeepseekCudaModel::DeepseekCudaModel(const DeepseekModel& host, Device device) : host_(host), device_(device) {
  SPECULA_CHECK(device.is_cuda(), "DeepseekCudaModel needs a CUDA device, not {}", device.str());
  stream_ = create_model_stream(device);
  linear_ = std::make_unique<CudaLinear>(device, stream_, false);
  ends_ = std::make_unique<CudaDecoderEnds>(host, device);
  for (const DeepseekModel::Layer& l : host.layers()) {
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
    layers_.push_back(std::move(d));
  }
}

DeepseekCudaModel::~DeepseekCudaModel() {
  graphs_.clear();
  linear_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

size_t DeepseekCudaModel::weight_bytes() const {
  auto held = [](const Buffer& b) { return b.data() != nullptr ? b.nbytes() : 0; };
  size_t bytes = ends_->bytes();
  for (const Layer& l : layers_) {
    for (const Buffer* b : {&l.input_norm, &l.post_norm, &l.w_in, &l.q_a_norm, &l.wq_b, &l.kv_a_norm, &l.wkv_b,
                            &l.wkv_b_bf16, &l.wo, &l.w_gate_up, &l.w_down}) {
      bytes += held(*b);
    }
  }
  return bytes;
}

Buffer& DeepseekCudaModel::scratch(Workspace& ws, Slot slot, DType dtype, int64_t elements) {
  return ws.get(slot, dtype, elements, device_);
}

std::pair<void*, void*> DeepseekCudaModel::split_scratch(Workspace& ws, const Buffer& w, int64_t n, int in) {
  if (!linear_->needs_split(w, n, in)) return {nullptr, nullptr};
  return {scratch(ws, kHi, DType::bf16, n * in).data(), scratch(ws, kLo, DType::bf16, n * in).data()};
}

void DeepseekCudaModel::linear(Workspace& ws, const float* x, const Buffer& w, float* y, int64_t n, int in, int out) {
  const auto [hi, lo] = split_scratch(ws, w, n, in);
  (*linear_)(x, w, Buffer{}, y, n, in, out, hi, lo);
}

void DeepseekCudaModel::run_layers(const ForwardBatch& batch, MlaAttentionBackend& backend, Workspace& ws, int64_t n) {
  const ModelConfig& c = host_.config();
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

  ends_->embed_rows(ids, x, n, 1.0f, s);
  ck::rms_norm_rows(x, layers_[0].input_norm.data_as<const float>(), xn, n, h, eps, s);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    linear(ws, xn, w.w_in, in, n, h, in_width);
    if (m.q_lora_rank > 0) {
      ck::rms_norm_strided(in, in_width, w.q_a_norm.data_as<const float>(), qa, m.q_lora_rank, n, m.q_lora_rank,
                           DeepseekModel::kLatentNormEps, s);
      linear(ws, qa, w.wq_b, q, n, m.q_lora_rank, H * qk);
    }
    const float* wkv_b = w.wkv_b.data_as<const float>();
    const int64_t head_rows = static_cast<int64_t>(nope + vd) * R;  // kv_b_proj floats per head
    if (n > 0 && !expanded) {
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
    pack.rope_factor = host_.rope_attention_factor();
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
      backend.forward_expanded(q_exp, kv_c_view, k_pe_view, values_bf16, host_.mla_layers()[l], batch, expand,
                               MlaForwardOptions{});
      ck::bf16_to_f32(out.data(), values, n * H * vd, s);
    } else {
      backend.forward(q_view, kv_c_view, k_pe_view, out_view, host_.mla_layers()[l], batch, MlaForwardOptions{});
      ck::bf16_to_f32(out.data(), out_f32, n * H * R, s);
    }
    if (n > 0 && !expanded) {
      // values[:, h] = o[:, h] W_UV[h]^T.
      linear_->batched({out_f32, static_cast<int64_t>(H) * R, R}, {wkv_b + static_cast<int64_t>(nope) * R, R, head_rows},
                       true, values, static_cast<int64_t>(H) * vd, vd, n, R, vd, H);
    }
    linear(ws, values, w.wo, o, n, H * vd, h);
    ck::add_rms_norm_rows(x, o, w.post_norm.data_as<const float>(), xn, n, h, eps, s);
    const auto [hi, lo] = split_scratch(ws, w.w_gate_up, n, h);
    linear_->gated(xn, w.w_gate_up, Buffer{}, act, n, h, inter, false, gate_up, hi, lo);
    linear(ws, act, w.w_down, o, n, inter, h);
    // The residual add, fused with the next layer's input norm.
    if (l + 1 < layers_.size()) {
      ck::add_rms_norm_rows(x, o, layers_[l + 1].input_norm.data_as<const float>(), xn, n, h, eps, s);
    } else {
      ck::add_inplace(x, o, n * h, s);
    }
  }

}

float* DeepseekCudaModel::run_head(Workspace& ws, const int32_t* row_ids, int64_t count) {
  const ModelConfig& c = host_.config();
  float* selected = scratch(ws, kSelected, DType::f32, count * c.hidden_size).data_as<float>();
  float* out = scratch(ws, kLogits, DType::f32, count * c.vocab_size).data_as<float>();
  ends_->logits(ws.slots[kX].data_as<const float>(), row_ids, count, selected, out,
                [&](const float* x, const Buffer& w, float* y, int64_t n, int in, int o) { linear(ws, x, w, y, n, in, o); },
                static_cast<cudaStream_t>(stream_));
  return out;
}

void DeepseekCudaModel::forward(const ForwardBatch& batch, MlaAttentionBackend& backend, std::vector<float>& logits,
                                bool all_tokens, std::vector<int32_t>* greedy_ids) {
  const ModelConfig& c = host_.config();
  const auto s = static_cast<cudaStream_t>(stream_);
  const int64_t n = batch.num_tokens();
  SPECULA_CHECK(static_cast<int64_t>(batch.input_ids.size()) == n && static_cast<int64_t>(batch.positions.size()) == n,
                "batch has {} tokens but {} input_ids and {} positions", n, batch.input_ids.size(), batch.positions.size());
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
  upload_i32_async(scratch(eager_, kIds, DType::i32, n), batch.input_ids, s);
  upload_i32_async(scratch(eager_, kPositions, DType::i32, n), batch.positions, s);
  run_layers(batch, backend, eager_, n);
  const std::vector<int32_t> rows = logit_rows(batch, all_tokens);
  const int64_t count = rows.empty() ? n : static_cast<int64_t>(rows.size());
  const int32_t* row_ids = nullptr;
  if (!rows.empty()) {
    Buffer& b = scratch(eager_, kRows, DType::i32, count);
    upload_i32_async(b, rows, s);
    row_ids = b.data_as<const int32_t>();
  }
  const float* out = run_head(eager_, row_ids, count);
  download_step(pinned_, out, count, c.vocab_size, logits, greedy_ids, greedy_dev_, nullptr, nullptr, device_, s);
}

void DeepseekCudaModel::capture_decode_graphs(MlaAttentionBackend& backend, std::vector<int> batch_sizes,
                                              int32_t padding_req_row, int32_t padding_slot, ReqToTokenPool* req_pool,
                                              MLAKVPool* kv_pool) {
  const auto s = static_cast<cudaStream_t>(stream_);
  graphs_.capture(
      std::move(batch_sizes), padding_req_row, padding_slot, stream_,
      [&](ForwardBatch& b) {
        b.req_to_token_pool = req_pool;
        b.mla_kv_pool = kv_pool;
        backend.init_forward_metadata_capture_cuda_graph(b);
        upload_i32_async(scratch(graph_ws_, kIds, DType::i32, b.batch_size), b.input_ids, s);
        upload_i32_async(scratch(graph_ws_, kPositions, DType::i32, b.batch_size), b.positions, s);
      },
      [&](const ForwardBatch& b) {
        run_layers(b, backend, graph_ws_, b.batch_size);
        run_head(graph_ws_, nullptr, b.batch_size);
      },
      [&] { graph_ws_.frozen = true; });
}

bool DeepseekCudaModel::forward_decode_graph(const ForwardBatch& batch, MlaAttentionBackend& backend,
                                             std::vector<float>& logits, std::vector<int32_t>* greedy_ids) {
  ForwardBatch padded;
  const CudaGraph* graph = graphs_.find(batch, &padded);
  if (graph == nullptr) return false;
  const ModelConfig& c = host_.config();
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
  const auto s = static_cast<cudaStream_t>(stream_);
  backend.init_forward_metadata_replay_cuda_graph(padded);
  upload_i32_async(graph_ws_.slots[kIds], padded.input_ids, s);
  upload_i32_async(graph_ws_.slots[kPositions], padded.positions, s);
  graph->launch(stream_);
  download_step(pinned_, graph_ws_.slots[kLogits].data_as<const float>(), batch.batch_size, c.vocab_size, logits,
                greedy_ids, greedy_dev_, nullptr, nullptr, device_, s);
  return true;
}

std::vector<int> DeepseekCudaModel::graph_batch_sizes() const { return graphs_.batch_sizes(); }

}  // namespace specula
