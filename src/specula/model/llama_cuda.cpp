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
  const ModelConfig& c = host.config();
  const DecoderLayerDims dims{c.hidden_size, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                             c.intermediate_size, static_cast<float>(c.rms_norm_eps), c.hidden_act == "gelu_pytorch_tanh"};
  for (const LlamaModel::Layer& l : host.layers()) layers_.emplace_back(l, dims, device);
}

LlamaCudaModel::~LlamaCudaModel() {
  graphs_.clear();
  verify_graphs_.clear();
  linear_.reset();
  if (results_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(results_event_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Buffer& LlamaCudaModel::scratch(Workspace& ws, Slot slot, DType dtype, int64_t elements) {
  return ws.main.get(slot, dtype, elements, device_);
}

CudaStepLinear LlamaCudaModel::step_linear(Workspace& ws) const { return {*linear_, ws.layer, device_}; }

size_t LlamaCudaModel::weight_bytes() const {
  size_t bytes = ends_->bytes();
  for (const CudaDecoderLayer& l : layers_) bytes += l.bytes();
  return bytes;
}

void LlamaCudaModel::run_layers(const ForwardBatch& batch, AttentionBackend& backend, Workspace& ws, int64_t n,
                                HiddenCapture* capture) {
  const ModelConfig& c = host_.config();
  const auto s = static_cast<cudaStream_t>(stream_);
  const int h = c.hidden_size;
  const int32_t* ids = scratch(ws, kIds, DType::i32, n).data_as<const int32_t>();
  float* x = scratch(ws, kX, DType::f32, n * h).data_as<float>();
  float* xn = scratch(ws, kXn, DType::f32, n * h).data_as<float>();
  const float eps = static_cast<float>(c.rms_norm_eps);
  CudaLayerStep st;
  st.n = n;
  st.attn_input = xn;
  st.x = x;
  st.xn = xn;
  st.positions = scratch(ws, kPositions, DType::i32, n).data_as<const int32_t>();
  st.inv_freq = ends_->inv_freq().data_as<const float>();
  st.rope_factor = host_.rope_attention_factor();
  // The q/k/v epilogue writes K and V straight into the cache (kCacheLoc holds out_cache_loc)
  // when the pool holds rows it can write; otherwise the backend writes them.
  MHAKVPool* kv_pool = batch.token_to_kv_pool;
  const bool fused_kv_write = kv_pool != nullptr && kv_pool->config().device == device_ &&
                              (kv_pool->dtype() == DType::bf16 || kv_pool->dtype() == DType::fp8_e4m3) &&
                              kv_pool->config().num_kv_heads == c.num_key_value_heads &&
                              kv_pool->config().head_dim == c.head_dim && kv_pool->config().v_head_dim == c.head_dim;
  const int32_t* kv_loc = fused_kv_write ? scratch(ws, kCacheLoc, DType::i32, n).data_as<const int32_t>() : nullptr;
  ForwardOptions fo;
  fo.save_kv_cache = kv_loc == nullptr;

  const float embed_scale = c.gemma2 ? std::sqrt(static_cast<float>(h)) : 1.0f;
  ends_->embed_rows(ids, x, n, embed_scale, s);
  ck::rms_norm_rows(x, layers_[0].input_norm().data_as<const float>(), xn, n, h, eps, s);
  const size_t captured = capture != nullptr ? capture->layers.size() : 0;
  if (capture != nullptr) capture->prepare(c.num_hidden_layers, n, h);
  float* captured_states =
      captured > 0 ? scratch(ws, kCaptured, DType::f32, n * static_cast<int64_t>(captured) * h).data_as<float>() : nullptr;
  // Copies [n, h] into capture entry e of every token of kCaptured (download_capture brings it
  // to the host; device-to-device copies can be captured in a graph).
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
  const CudaStepLinear linear = step_linear(ws);
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (size_t e = 0; e < captured; ++e) {
      if (capture->layers[e] == static_cast<int>(l) && (l == 0 || e != first_entry(l))) store(e, x);
    }
    if (kv_loc != nullptr) {
      st.kv = {kv_pool->k_buffer(static_cast<int>(l)).data(), kv_pool->v_buffer(static_cast<int>(l)).data(), kv_loc,
               static_cast<int>(kv_pool->dtype()), kv_pool->k_scale(static_cast<int>(l)),
               kv_pool->v_scale(static_cast<int>(l))};
    }
    // The residual add, fused with the next layer's input norm.
    const bool last = l + 1 == layers_.size();
    st.end_norm = last ? nullptr : layers_[l + 1].input_norm().data_as<const float>();
    st.end_out = xn;
    st.end_copy = last ? nullptr : capture_dst(l + 1);
    st.end_copy_stride = static_cast<int64_t>(captured) * h;
    const AttentionLayer& layer = host_.attention_layers()[l];
    layers_[l].forward(
        st,
        [&](const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
          backend.forward(q, k, v, out, layer, batch, fo);
        },
        linear, s);
  }
  for (size_t e = 0; e < captured; ++e) {
    if (capture->layers[e] != HiddenCapture::kFinalNormed) continue;
    ck::rms_norm_rows(x, ends_->final_norm().data_as<const float>(), xn, n, h, eps, s);
    store(e, xn);
  }
}

float* LlamaCudaModel::run_head(Workspace& ws, const int32_t* row_ids, int64_t count) {
  const ModelConfig& c = host_.config();
  float* selected = scratch(ws, kSelected, DType::f32, count * c.hidden_size).data_as<float>();
  float* out = scratch(ws, kLogits, DType::f32, count * c.vocab_size).data_as<float>();
  const CudaStepLinear linear = step_linear(ws);
  ends_->logits(ws[kX].data_as<const float>(), row_ids, count, selected, out,
                [&](const float* x, const Buffer& w, float* y, int64_t n, int in, int o) { linear(x, w, Buffer{}, y, n, in, o); },
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
  upload_ids_async(scratch(eager_, kIds, DType::i32, n), batch, batch.batch_size, s);
  upload_i32_async(scratch(eager_, kPositions, DType::i32, n), batch.positions, s);
  upload_i32_async(scratch(eager_, kCacheLoc, DType::i32, n), batch.out_cache_loc, s);
  run_layers(batch, backend, eager_, n, capture);
  const std::vector<int32_t> rows = logit_rows(batch, all_tokens);
  const int64_t count = rows.empty() ? n : static_cast<int64_t>(rows.size());
  const int32_t* row_ids = nullptr;
  if (!rows.empty()) {
    Buffer& b = scratch(eager_, kRowIds, DType::i32, count);
    upload_i32_async(b, rows, s);
    row_ids = b.data_as<const int32_t>();
  }
  const float* out = run_head(eager_, row_ids, count);
  download_step(pinned_, out, count, c.vocab_size, logits, greedy_ids, greedy_dev_, capture,
                eager_[kCaptured].data_as<const float>(), device_, s, results_hook(batch, eager_, greedy_ids, capture),
                static_cast<cudaEvent_t>(results_event_));
}

std::function<void()> LlamaCudaModel::results_hook(const ForwardBatch& batch, const Workspace& ws,
                                                   const std::vector<int32_t>* greedy_ids, const HiddenCapture* capture) {
  const SpecInfo* info = batch.spec_info.get();
  if (info == nullptr || !info->on_device_results || greedy_ids == nullptr || capture == nullptr) return {};
  return [this, info, &ws, n = batch.num_tokens()] {
    info->on_device_results({ws[kIds].data_as<const int32_t>(), greedy_dev_.data_as<const int32_t>(),
                             ws[kCaptured].data_as<const float>(), n});
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
        upload_i32_async(scratch(graph_ws_, kIds, DType::i32, b.batch_size), b.input_ids, s);
        upload_i32_async(scratch(graph_ws_, kPositions, DType::i32, b.batch_size), b.positions, s);
        upload_i32_async(scratch(graph_ws_, kCacheLoc, DType::i32, b.batch_size), b.out_cache_loc, s);
      },
      [&](const ForwardBatch& b) {
        run_layers(b, backend, graph_ws_, b.batch_size);
        run_head(graph_ws_, nullptr, b.batch_size);
      },
      [&] { graph_ws_.freeze(); });
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
  upload_i32_async(graph_ws_[kIds], padded.input_ids, s);
  upload_i32_async(graph_ws_[kPositions], padded.positions, s);
  upload_i32_async(graph_ws_[kCacheLoc], padded.out_cache_loc, s);
  graph->launch(stream_);
  download_step(pinned_, graph_ws_[kLogits].data_as<const float>(), batch.batch_size, c.vocab_size, logits, greedy_ids,
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
  ForwardBatch b;
  HiddenCapture capture;
  capture.layers = verify_capture_layers_;
  verify_graphs_.capture(
      stream_, std::move(batch_sizes),
      [&](int bs) {
        b = verify_padding_batch(bs);
        const int64_t n = b.num_tokens();
        backend.init_forward_metadata_capture_cuda_graph(b);
        upload_i32_async(scratch(verify_ws_, kIds, DType::i32, n), b.input_ids, s);
        upload_i32_async(scratch(verify_ws_, kPositions, DType::i32, n), b.positions, s);
        upload_i32_async(scratch(verify_ws_, kCacheLoc, DType::i32, n), b.out_cache_loc, s);
      },
      [&](int) {
        run_layers(b, backend, verify_ws_, b.num_tokens(), &capture);
        run_head(verify_ws_, nullptr, b.num_tokens());
      },
      [&] { verify_ws_.freeze(); });
}

bool LlamaCudaModel::forward_verify_graph(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits,
                                          HiddenCapture* capture, std::vector<int32_t>* greedy_ids) {
  if (batch.forward_mode != ForwardMode::TARGET_VERIFY || batch.spec_info == nullptr ||
      batch.spec_info->num_draft_tokens != verify_tokens_ || batch.spec_info->custom_mask.empty() ||
      !batch.spec_info->prefix_visible) {
    return false;
  }
  if (capture != nullptr ? capture->layers != verify_capture_layers_ : !verify_capture_layers_.empty()) return false;
  const auto [bs, graph] = verify_graphs_.find(batch.batch_size);
  if (graph == nullptr) return false;
  const ModelConfig& c = host_.config();
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
  const auto s = static_cast<cudaStream_t>(stream_);
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
  upload_ids_async(verify_ws_[kIds], *run, batch.batch_size, s);
  upload_i32_async(verify_ws_[kPositions], run->positions, s);
  upload_i32_async(verify_ws_[kCacheLoc], run->out_cache_loc, s);
  graph->launch(stream_);
  const int64_t n = batch.num_tokens();
  if (capture != nullptr) capture->prepare(c.num_hidden_layers, n, c.hidden_size);
  download_step(pinned_, verify_ws_[kLogits].data_as<const float>(), n, c.vocab_size, logits, greedy_ids, greedy_dev_,
                capture, verify_ws_[kCaptured].data_as<const float>(), device_, s,
                results_hook(batch, verify_ws_, greedy_ids, capture), static_cast<cudaEvent_t>(results_event_));
  return true;
}

std::vector<int> LlamaCudaModel::graph_batch_sizes() const { return graphs_.batch_sizes(); }

}  // namespace specula
