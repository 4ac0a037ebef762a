// LlamaCudaModel: upload, then the decoder step as a sequence of cuBLAS and element-wise launches
// on the model's stream, eagerly or as captured decode graphs.
#include "specula/model/llama_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_graph.h"
#include "specula/core/error.h"
#include "specula/core/pinned_buffer.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/model/cuda/fused_ops.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/model_ops.h"
#include "specula/model/cuda/step_io.h"

namespace specula {

namespace ck = cuda_kernels;


LlamaCudaModel::LlamaCudaModel(const LlamaModel& host, Device device, bool deterministic)
    : host_(host), device_(device), deterministic_(deterministic) {
  SPECULA_CHECK(device.is_cuda(), "LlamaCudaModel needs a CUDA device, not {}", device.str());
  {
    // Deterministic mode runs every product through the GEMV kernel, which reads rows in
    // 8-element chunks.
    const ModelConfig& c = host.config();
    const int widths[] = {c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size};
    for (int w : widths) {
      SPECULA_CHECK(!deterministic || w % 8 == 0,
                    "deterministic inference needs matrix widths that are multiples of 8; this model has {}", w);
    }
  }
  stream_ = create_model_stream(device);
  cudaEvent_t results = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&results, cudaEventDisableTiming));
  results_event_ = results;
  linear_ = std::make_unique<CudaLinear>(device, stream_, deterministic);
  ends_ = std::make_unique<CudaDecoderEnds>(host, device);
  for (const LlamaModel::Layer& l : host.layers()) {
    Layer d;
    d.input_norm = upload_f32(l.input_norm, device);
    d.post_norm = upload_f32(l.post_norm, device);
    d.post_attn_norm = upload_f32(l.post_attn_norm, device);
    d.post_ffn_norm = upload_f32(l.post_ffn_norm, device);
    // q|k|v and gate|up as one matrix each: one product (and one pass over x) instead of 3 and 2.
    d.w_qkv = upload_weight(stack_rows({&l.wq, &l.wk, &l.wv}), device);
    d.b_qkv = upload_f32(stack_rows({&l.bq, &l.bk, &l.bv}), device);
    d.wo = upload_weight(l.wo, device);
    d.bo = upload_f32(l.bo, device);
    d.w_gate_up = upload_weight(stack_rows({&l.w_gate, &l.w_up}), device);
    d.b_gate_up = upload_f32(stack_rows({&l.b_gate, &l.b_up}), device);
    d.w_down = upload_weight(l.w_down, device);
    d.b_down = upload_f32(l.b_down, device);
    d.q_norm = upload_f32(l.q_norm, device);
    d.k_norm = upload_f32(l.k_norm, device);
    layers_.push_back(std::move(d));
  }
}

LlamaCudaModel::~LlamaCudaModel() {
  graphs_.clear();
  verify_graphs_.clear();
  linear_.reset();
  if (results_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(results_event_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Buffer& LlamaCudaModel::scratch(Workspace& ws, size_t slot, DType dtype, int64_t elements) {
  return ws.get(slot, dtype, elements, device_);
}

std::pair<void*, void*> LlamaCudaModel::split_scratch(Workspace& ws, const Buffer& w, int64_t n, int in) {
  if (!linear_->needs_split(w, n, in)) return {nullptr, nullptr};
  return {scratch(ws, 18, DType::bf16, n * in).data(), scratch(ws, 19, DType::bf16, n * in).data()};
}

void LlamaCudaModel::linear(Workspace& ws, const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n,
                            int in, int out) {
  const auto [hi, lo] = split_scratch(ws, w, n, in);
  (*linear_)(x, w, bias, y, n, in, out, hi, lo);
}

size_t LlamaCudaModel::weight_bytes() const {
  auto held = [](const Buffer& b) { return b.data() != nullptr ? b.nbytes() : 0; };
  size_t bytes = ends_->bytes();
  for (const Layer& l : layers_) {
    for (const Buffer* b : {&l.input_norm, &l.post_norm, &l.post_attn_norm, &l.post_ffn_norm, &l.w_qkv, &l.b_qkv, &l.wo,
                            &l.bo, &l.w_gate_up, &l.b_gate_up, &l.w_down, &l.b_down, &l.q_norm, &l.k_norm}) {
      bytes += held(*b);
    }
  }
  return bytes;
}

void LlamaCudaModel::run_layers(const ForwardBatch& batch, AttentionBackend& backend, Workspace& ws, int64_t n,
                                HiddenCapture* capture) {
  const ModelConfig& c = host_.config();
  const auto s = static_cast<cudaStream_t>(stream_);
  const int h = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int inter = c.intermediate_size, qkv_width = (Hq + 2 * Hkv) * D;
  const int32_t* ids = scratch(ws, 0, DType::i32, n).data_as<const int32_t>();
  const int32_t* pos = scratch(ws, 1, DType::i32, n).data_as<const int32_t>();
  float* x = scratch(ws, 2, DType::f32, n * h).data_as<float>();
  float* xn = scratch(ws, 3, DType::f32, n * h).data_as<float>();
  float* qkv = scratch(ws, 4, DType::f32, n * qkv_width).data_as<float>();
  float* o = scratch(ws, 7, DType::f32, n * h).data_as<float>();
  float* gate_up = scratch(ws, 8, DType::f32, n * 2 * inter).data_as<float>();
  float* act = scratch(ws, 9, DType::f32, n * inter).data_as<float>();
  float* attn = scratch(ws, 10, DType::f32, n * Hq * D).data_as<float>();
  Buffer& qb = scratch(ws, 11, DType::bf16, n * Hq * D);
  Buffer& kb = scratch(ws, 12, DType::bf16, n * Hkv * D);
  Buffer& vb = scratch(ws, 13, DType::bf16, n * Hkv * D);
  Buffer& ab = scratch(ws, 14, DType::bf16, n * Hq * D);
  const TensorView q_view(qb.data(), DType::bf16, {n, Hq, D}, device_);
  const TensorView k_view(kb.data(), DType::bf16, {n, Hkv, D}, device_);
  const TensorView v_view(vb.data(), DType::bf16, {n, Hkv, D}, device_);
  const TensorView a_view(ab.data(), DType::bf16, {n, Hq, D}, device_);
  const float eps = static_cast<float>(c.rms_norm_eps);
  // The q/k/v epilogue writes K and V straight into the cache (slot 6 holds out_cache_loc) when
  // the pool holds rows it can write; otherwise the backend writes them.
  MHAKVPool* kv_pool = batch.token_to_kv_pool;
  const bool fused_kv_write = kv_pool != nullptr && kv_pool->config().device == device_ &&
                              (kv_pool->dtype() == DType::bf16 || kv_pool->dtype() == DType::fp8_e4m3) &&
                              kv_pool->config().num_kv_heads == Hkv && kv_pool->config().head_dim == D &&
                              kv_pool->config().v_head_dim == D;
  const int32_t* kv_loc = fused_kv_write ? scratch(ws, 6, DType::i32, n).data_as<const int32_t>() : nullptr;

  const float embed_scale = c.gemma2 ? std::sqrt(static_cast<float>(h)) : 1.0f;
  ends_->embed_rows(ids, x, n, embed_scale, s);
  ck::rms_norm_rows(x, layers_[0].input_norm.data_as<const float>(), xn, n, h, eps, s);
  const size_t captured = capture != nullptr ? capture->layers.size() : 0;
  if (capture != nullptr) capture->prepare(c.num_hidden_layers, n, h);
  float* captured_states = captured > 0 ? scratch(ws, 5, DType::f32, n * static_cast<int64_t>(captured) * h).data_as<float>() : nullptr;
  // Copies [n, h] into capture entry e of every token of slot 5 (download_capture brings it to
  // the host; device-to-device copies can be captured in a graph).
  auto store = [&](size_t e, const float* src) {
    CUDA_CHECK(cudaMemcpy2DAsync(captured_states + e * static_cast<size_t>(h), captured * h * sizeof(float), src,
                                 h * sizeof(float), h * sizeof(float), static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
  };
  // The first capture entry of the residual stream entering layer l (captured.size() if none).
  // From layer 1 on, the add + RMSNorm that produces that stream writes this entry too; layer 0's
  // entries (the embedding) and repeated entries of one layer are copied.
  auto first_entry = [&](size_t l) {
    size_t e = 0;
    while (e < captured && capture->layers[e] != static_cast<int>(l)) ++e;
    return e;
  };
  auto capture_dst = [&](size_t l) -> float* {
    const size_t e = first_entry(l);
    return e < captured ? captured_states + e * static_cast<size_t>(h) : nullptr;
  };
  const auto capture_stride = static_cast<int64_t>(captured) * h;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    for (size_t e = 0; e < captured; ++e) {
      if (capture->layers[e] == static_cast<int>(l) && (l == 0 || e != first_entry(l))) store(e, x);
    }
    linear(ws, xn, w.w_qkv, w.b_qkv, qkv, n, h, qkv_width);
    ck::QkvEpilogueParams e{};
    e.qkv = qkv;
    e.positions = pos;
    e.inv_freq = ends_->inv_freq().data_as<const float>();
    e.rope_factor = host_.rope_attention_factor();
    e.q_norm = w.q_norm.data() != nullptr ? w.q_norm.data_as<const float>() : nullptr;
    e.k_norm = w.k_norm.data() != nullptr ? w.k_norm.data_as<const float>() : nullptr;
    e.eps = eps;
    e.q = qb.data();
    e.k = kb.data();
    e.v = vb.data();
    e.n = n;
    e.num_q_heads = Hq;
    e.num_kv_heads = Hkv;
    e.head_dim = D;
    ForwardOptions fo;
    if (kv_loc != nullptr) {
      e.k_cache = kv_pool->k_buffer(static_cast<int>(l)).data();
      e.v_cache = kv_pool->v_buffer(static_cast<int>(l)).data();
      e.cache_loc = kv_loc;
      e.cache_dtype = static_cast<int>(kv_pool->dtype());
      e.k_scale = kv_pool->k_scale(static_cast<int>(l));
      e.v_scale = kv_pool->v_scale(static_cast<int>(l));
      fo.save_kv_cache = false;
    }
    ck::qkv_epilogue(e, s);
    backend.forward(q_view, k_view, v_view, a_view, host_.attention_layers()[l], batch, fo);
    linear_->product_bf16_x(ab.data(), w.wo, w.bo, o, n, Hq * D, h, attn);
    if (w.post_attn_norm.data() != nullptr) ck::rms_norm_rows(o, w.post_attn_norm.data_as<const float>(), o, n, h, eps, s);
    ck::add_rms_norm_rows(x, o, w.post_norm.data_as<const float>(), xn, n, h, eps, s);
    const auto [hi, lo] = split_scratch(ws, w.w_gate_up, n, h);
    linear_->gated(xn, w.w_gate_up, w.b_gate_up, act, n, h, inter, c.hidden_act == "gelu_pytorch_tanh", gate_up, hi, lo);
    linear(ws, act, w.w_down, w.b_down, o, n, inter, h);
    if (w.post_ffn_norm.data() != nullptr) ck::rms_norm_rows(o, w.post_ffn_norm.data_as<const float>(), o, n, h, eps, s);
    // The residual add, fused with the next layer's input norm.
    if (l + 1 < layers_.size()) {
      ck::add_rms_norm_rows(x, o, layers_[l + 1].input_norm.data_as<const float>(), xn, n, h, eps, s, capture_dst(l + 1),
                            capture_stride);
    } else {
      ck::add_inplace(x, o, n * h, s);
    }
  }
  for (size_t e = 0; e < captured; ++e) {
    if (capture->layers[e] != HiddenCapture::kFinalNormed) continue;
    ck::rms_norm_rows(x, ends_->final_norm().data_as<const float>(), xn, n, h, eps, s);
    store(e, xn);
  }
}

float* LlamaCudaModel::run_head(Workspace& ws, const int32_t* row_ids, int64_t count) {
  const ModelConfig& c = host_.config();
  float* selected = scratch(ws, 16, DType::f32, count * c.hidden_size).data_as<float>();
  float* out = scratch(ws, 17, DType::f32, count * c.vocab_size).data_as<float>();
  ends_->logits(ws.slots[2].data_as<const float>(), row_ids, count, selected, out,
                [&](const float* x, const Buffer& w, float* y, int64_t n, int in, int o) {
                  linear(ws, x, w, Buffer{}, y, n, in, o);
                },
                static_cast<cudaStream_t>(stream_));
  return out;
}

void LlamaCudaModel::forward(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits, bool all_tokens,
                             HiddenCapture* capture, std::vector<int32_t>* greedy_ids) {
  const ModelConfig& c = host_.config();
  const auto s = static_cast<cudaStream_t>(stream_);
  const int64_t n = batch.num_tokens();
  SPECULA_CHECK(static_cast<int64_t>(batch.input_ids.size()) == n && static_cast<int64_t>(batch.positions.size()) == n,
                "batch has {} tokens but {} input_ids and {} positions", n, batch.input_ids.size(), batch.positions.size());
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
  upload_ids_async(scratch(eager_, 0, DType::i32, n), batch, batch.batch_size, s);
  upload_i32_async(scratch(eager_, 1, DType::i32, n), batch.positions, s);
  upload_i32_async(scratch(eager_, 6, DType::i32, n), batch.out_cache_loc, s);
  run_layers(batch, backend, eager_, n, capture);
  const std::vector<int32_t> rows = logit_rows(batch, all_tokens);
  const int64_t count = rows.empty() ? n : static_cast<int64_t>(rows.size());
  const int32_t* row_ids = nullptr;
  if (!rows.empty()) {
    Buffer& b = scratch(eager_, 15, DType::i32, count);
    upload_i32_async(b, rows, s);
    row_ids = b.data_as<const int32_t>();
  }
  const float* out = run_head(eager_, row_ids, count);
  download_step(pinned_, out, count, c.vocab_size, logits, greedy_ids, greedy_dev_, capture,
                eager_.slots[5].data_as<const float>(), device_, s, results_hook(batch, eager_, greedy_ids, capture),
                static_cast<cudaEvent_t>(results_event_));
}

std::function<void()> LlamaCudaModel::results_hook(const ForwardBatch& batch, const Workspace& ws,
                                                   const std::vector<int32_t>* greedy_ids, const HiddenCapture* capture) {
  const SpecInfo* info = batch.spec_info.get();
  if (info == nullptr || !info->on_device_results || greedy_ids == nullptr || capture == nullptr) return {};
  return [this, info, &ws, n = batch.num_tokens()] {
    info->on_device_results({ws.slots[0].data_as<const int32_t>(), greedy_dev_.data_as<const int32_t>(),
                             ws.slots[5].data_as<const float>(), n});
  };
}

void LlamaCudaModel::capture_decode_graphs(AttentionBackend& backend, std::vector<int> batch_sizes, int32_t padding_req_row,
                                           int32_t padding_slot, ReqToTokenPool* req_pool, MHAKVPool* kv_pool) {
  const auto s = static_cast<cudaStream_t>(stream_);
  graphs_.capture(
      std::move(batch_sizes), padding_req_row, padding_slot, stream_,
      [&](ForwardBatch& b) {
        b.req_to_token_pool = req_pool;
        b.token_to_kv_pool = kv_pool;
        backend.init_forward_metadata_capture_cuda_graph(b);
        upload_i32_async(scratch(graph_ws_, 0, DType::i32, b.batch_size), b.input_ids, s);
        upload_i32_async(scratch(graph_ws_, 1, DType::i32, b.batch_size), b.positions, s);
        upload_i32_async(scratch(graph_ws_, 6, DType::i32, b.batch_size), b.out_cache_loc, s);
      },
      [&](const ForwardBatch& b) {
        run_layers(b, backend, graph_ws_, b.batch_size);
        run_head(graph_ws_, nullptr, b.batch_size);
      },
      [&] { graph_ws_.frozen = true; });
}

bool LlamaCudaModel::forward_decode_graph(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits,
                                          std::vector<int32_t>* greedy_ids) {
  ForwardBatch padded;
  const CudaGraph* graph = graphs_.find(batch, &padded);
  if (graph == nullptr) return false;
  const ModelConfig& c = host_.config();
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
  const auto s = static_cast<cudaStream_t>(stream_);
  backend.init_forward_metadata_replay_cuda_graph(padded);
  upload_i32_async(graph_ws_.slots[0], padded.input_ids, s);
  upload_i32_async(graph_ws_.slots[1], padded.positions, s);
  upload_i32_async(graph_ws_.slots[6], padded.out_cache_loc, s);
  graph->launch(stream_);
  download_step(pinned_, graph_ws_.slots[17].data_as<const float>(), batch.batch_size, c.vocab_size, logits, greedy_ids,
                greedy_dev_, nullptr, nullptr, device_, s);
  return true;
}

ForwardBatch LlamaCudaModel::verify_padding_batch(int batch_size) const {
  const int N = verify_tokens_;
  ForwardBatch b;
  b.forward_mode = ForwardMode::TARGET_VERIFY;
  b.batch_size = batch_size;
  auto info = std::make_shared<SpecInfo>();
  info->num_draft_tokens = N;
  info->prefix_visible = true;
  const int32_t* row = verify_req_pool_->row(verify_padding_row_);
  for (int i = 0; i < batch_size; ++i) {
    b.req_pool_indices.push_back(verify_padding_row_);
    b.seq_lens.push_back(1);
    for (int t = 0; t < N; ++t) {
      b.input_ids.push_back(0);
      b.positions.push_back(1 + t);
      b.out_cache_loc.push_back(row[1 + t]);
    }
    // Every key visible: no row of the padding is empty.
    info->custom_mask.insert(info->custom_mask.end(), static_cast<size_t>(N) * (N + 1), 1);
  }
  b.spec_info = info;
  b.req_to_token_pool = verify_req_pool_;
  b.token_to_kv_pool = verify_kv_pool_;
  return b;
}

void LlamaCudaModel::capture_verify_graphs(AttentionBackend& backend, std::vector<int> batch_sizes, int num_draft_tokens,
                                           std::vector<int> capture_layers, int32_t padding_req_row,
                                           ReqToTokenPool* req_pool, MHAKVPool* kv_pool) {
  SPECULA_CHECK(num_draft_tokens >= 1, "verify graphs need num_draft_tokens >= 1, not {}", num_draft_tokens);
  const auto s = static_cast<cudaStream_t>(stream_);
  verify_graphs_.clear();
  verify_ws_ = Workspace{};
  verify_tokens_ = num_draft_tokens;
  verify_capture_layers_ = std::move(capture_layers);
  verify_padding_row_ = padding_req_row;
  verify_req_pool_ = req_pool;
  verify_kv_pool_ = kv_pool;
  std::sort(batch_sizes.begin(), batch_sizes.end(), std::greater<>());
  for (int bs : batch_sizes) {
    SPECULA_CHECK(bs >= 1, "CUDA-graph batch size {} is not valid", bs);
    const ForwardBatch b = verify_padding_batch(bs);
    const int64_t n = b.num_tokens();
    HiddenCapture capture;
    capture.layers = verify_capture_layers_;
    backend.init_forward_metadata_capture_cuda_graph(b);
    upload_i32_async(scratch(verify_ws_, 0, DType::i32, n), b.input_ids, s);
    upload_i32_async(scratch(verify_ws_, 1, DType::i32, n), b.positions, s);
    upload_i32_async(scratch(verify_ws_, 6, DType::i32, n), b.out_cache_loc, s);
    run_layers(b, backend, verify_ws_, n, &capture);
    run_head(verify_ws_, nullptr, n);
    CUDA_CHECK(cudaStreamSynchronize(s));
    verify_ws_.frozen = true;
    verify_graphs_[bs] = std::make_unique<CudaGraph>(stream_, [&] {
      run_layers(b, backend, verify_ws_, n, &capture);
      run_head(verify_ws_, nullptr, n);
    });
  }
}

bool LlamaCudaModel::forward_verify_graph(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits,
                                          HiddenCapture* capture, std::vector<int32_t>* greedy_ids) {
  if (batch.forward_mode != ForwardMode::TARGET_VERIFY || batch.spec_info == nullptr ||
      batch.spec_info->num_draft_tokens != verify_tokens_ || batch.spec_info->custom_mask.empty() ||
      !batch.spec_info->prefix_visible) {
    return false;
  }
  if (capture != nullptr ? capture->layers != verify_capture_layers_ : !verify_capture_layers_.empty()) return false;
  const auto it = verify_graphs_.lower_bound(batch.batch_size);
  if (it == verify_graphs_.end()) return false;
  const ModelConfig& c = host_.config();
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
  const auto s = static_cast<cudaStream_t>(stream_);
  const int bs = it->first;
  // Padded only when no graph has exactly this batch size (no copy of the batch otherwise).
  ForwardBatch padded;
  const ForwardBatch* run = &batch;
  if (bs > batch.batch_size) {
    padded = batch;
    const ForwardBatch pad = verify_padding_batch(bs - batch.batch_size);
    auto append = [](auto& a, const auto& b) { a.insert(a.end(), b.begin(), b.end()); };
    append(padded.input_ids, pad.input_ids);
    append(padded.positions, pad.positions);
    append(padded.req_pool_indices, pad.req_pool_indices);
    append(padded.seq_lens, pad.seq_lens);
    append(padded.out_cache_loc, pad.out_cache_loc);
    auto info = std::make_shared<SpecInfo>(*batch.spec_info);
    append(info->custom_mask, pad.spec_info->custom_mask);
    padded.spec_info = info;
    padded.batch_size = bs;
    run = &padded;
  }
  backend.init_forward_metadata_replay_cuda_graph(*run);
  upload_ids_async(verify_ws_.slots[0], *run, batch.batch_size, s);
  upload_i32_async(verify_ws_.slots[1], run->positions, s);
  upload_i32_async(verify_ws_.slots[6], run->out_cache_loc, s);
  it->second->launch(stream_);
  const int64_t n = batch.num_tokens();
  if (capture != nullptr) capture->prepare(c.num_hidden_layers, n, c.hidden_size);
  download_step(pinned_, verify_ws_.slots[17].data_as<const float>(), n, c.vocab_size, logits, greedy_ids, greedy_dev_,
                capture, verify_ws_.slots[5].data_as<const float>(), device_, s,
                results_hook(batch, verify_ws_, greedy_ids, capture), static_cast<cudaEvent_t>(results_event_));
  return true;
}

std::vector<int> LlamaCudaModel::graph_batch_sizes() const { return graphs_.batch_sizes(); }

}  // namespace specula
