// LlamaCudaModel: the layers' upload, the layer loop (with the hidden-state capture a draft head
// reads) and TARGET_VERIFY graphs; the step skeleton is CudaDecoderExecutor's.
#include "specula/model/llama_cuda.h"

#include <cuda_runtime_api.h>


#include <algorithm>
#include <cmath>
#include <functional>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_graph.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/model/cuda/model_ops.h"
#include "specula/model/cuda/step_io.h"

namespace specula {

namespace ck = cuda_kernels;


LlamaCudaModel::LlamaCudaModel(std::unique_ptr<LlamaModel> host, const ModelOptions& options, const WeightSource* experts)
    : CudaDecoderExecutor(std::move(host), options.device, options.deterministic, options.vocab_begin,
                          options.vocab_end, options.tp_comm, options.nonblocking_stream) {
  const ModelConfig& c = model().config();
  // Deterministic mode runs every product through the GEMV kernel, which reads rows in 8-element
  // chunks.
  for (int w : {c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size}) {
    SPECULA_CHECK(!deterministic_ || w % 8 == 0,
                  "deterministic inference needs matrix widths that are multiples of 8; this model has {}", w);
  }
  const DecoderLayerDims dims{c.hidden_size, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                             c.intermediate_size, static_cast<float>(c.rms_norm_eps), c.hidden_act == "gelu_pytorch_tanh",
                             c.has_moe() ? &c.moe : nullptr};
  for (size_t l = 0; l < model().layers().size(); ++l) {
    layers_.emplace_back(model().layers()[l], dims, device_, experts, "model.layers." + std::to_string(l) + ".",
                         options.fp8_experts);
  }
  backend_ = make_llama_backend(model(), options, stream_);
}

LlamaCudaModel::~LlamaCudaModel() {
  // Graphs and the backend go before the executor's stream.
  verify_graphs_.clear();
  backend_.reset();
}

size_t LlamaCudaModel::layer_bytes() const {
  size_t bytes = 0;
  for (const CudaDecoderLayer& l : layers_) bytes += l.bytes();
  return bytes;
}

size_t LlamaCudaModel::decode_unread_bytes() const {
  size_t bytes = 0;
  for (const CudaDecoderLayer& l : layers_) bytes += l.moe_unread_bytes();
  return bytes;
}

void LlamaCudaModel::upload_model_step(Workspace& ws, const ForwardBatch& batch) {
  const std::vector<float> scales = dual_chunk_key_scales(model().config().dual_chunk, batch);
  if (!scales.empty()) {
    upload_f32_async(scratch(ws, kKeyScale, DType::f32, batch.num_tokens()), scales, static_cast<cudaStream_t>(stream_));
  }
}

void LlamaCudaModel::run_layers(const ForwardBatch& batch, Workspace& ws, int64_t n, HiddenCapture* capture) {
  const ModelConfig& c = model().config();
  AttentionBackend& backend = *backend_;
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
  st.rope_factor = model().rope_attention_factor();
  st.comm = tp_comm_;
  if (c.dual_chunk.enabled()) {
    st.dca_chunk_len = c.dual_chunk.chunk_len();
    st.dca_chunk_size = c.dual_chunk.chunk_size;
    if (c.dual_chunk.original_max_position_embeddings > 0) {
      st.key_scale = scratch(ws, kKeyScale, DType::f32, n).data_as<const float>();
    }
  }
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
    const AttentionLayer& layer = model().attention_layers()[l];
    st.q_variants = layer.dca_q_variants();
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

void LlamaCudaModel::forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) {
  if (r.use_cuda_graph && !r.all_tokens && r.capture == nullptr && replay_decode(batch, logits, r)) return;
  if (r.use_cuda_graph && r.all_tokens && forward_verify_graph(batch, logits, r)) return;
  eager_forward(batch, logits, r, results_hook(batch, eager_, r));
}

std::function<void()> LlamaCudaModel::results_hook(const ForwardBatch& batch, const Workspace& ws,
                                                   const ForwardRequest& r) {
  const SpecInfo* info = batch.spec_info.get();
  if (info == nullptr || !info->on_device_results || r.greedy_ids == nullptr || r.capture == nullptr) return {};
  return [this, info, &ws, n = batch.num_tokens()] {
    info->on_device_results({ws[kIds].data_as<const int32_t>(), greedy_.ids.data_as<const int32_t>(),
                             ws[kCaptured].data_as<const float>(), n});
  };
}

ForwardBatch LlamaCudaModel::verify_padding_batch(int batch_size, int N) const {
  ForwardBatch b;
  b.forward_mode = ForwardMode::TARGET_VERIFY;
  b.batch_size = batch_size;
  auto info = std::make_shared<SpecInfo>();
  info->num_draft_tokens = N;
  info->prefix_visible = true;
  const int32_t* row = verify_setup_.req_pool->row(verify_setup_.padding_req_row);
  for (int i = 0; i < batch_size; ++i) {
    b.req_pool_indices.push_back(verify_setup_.padding_req_row);
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
  b.req_to_token_pool = verify_setup_.req_pool;
  b.token_to_kv_pool = verify_setup_.kv_pool;
  return b;
}

void LlamaCudaModel::capture_verify_graphs(const GraphSetup& setup, const std::vector<int>& num_draft_tokens,
                                           const std::vector<int>& capture_layers) {
  std::vector<int> sizes = num_draft_tokens;
  for (int n : sizes) SPECULA_CHECK(n >= 1, "verify graphs need num_draft_tokens >= 1, not {}", n);
  // Largest first: its warm-up sizes the shared workspace before it is frozen.
  std::sort(sizes.rbegin(), sizes.rend());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  verify_graphs_.clear();
  verify_ws_ = Workspace{};
  verify_capture_layers_ = capture_layers;
  verify_setup_ = setup;
  ForwardBatch b;
  HiddenCapture capture;
  capture.layers = verify_capture_layers_;
  for (int N : sizes) {
    verify_graphs_[N].capture(
        stream_, setup.batch_sizes,
        [&](int bs) {
          b = verify_padding_batch(bs, N);
          backend_->init_forward_metadata_capture_cuda_graph(b);
          upload_step(verify_ws_, b, 0);
        },
        [&](int) {
          run_layers(b, verify_ws_, b.num_tokens(), &capture);
          run_head(verify_ws_, nullptr, b.num_tokens());
        },
        [&] { verify_ws_.freeze(); });
  }
}

bool LlamaCudaModel::forward_verify_graph(const ForwardBatch& batch, std::vector<float>& logits,
                                          const ForwardRequest& r) {
  if (batch.forward_mode != ForwardMode::TARGET_VERIFY || batch.spec_info == nullptr ||
      batch.spec_info->custom_mask.empty() || !batch.spec_info->prefix_visible) {
    return false;
  }
  const int N = batch.spec_info->num_draft_tokens;
  const auto graphs = verify_graphs_.find(N);
  if (graphs == verify_graphs_.end()) return false;
  if (r.capture != nullptr ? r.capture->layers != verify_capture_layers_ : !verify_capture_layers_.empty()) return false;
  const auto [bs, graph] = graphs->second.find(batch.batch_size);
  if (graph == nullptr) return false;
  const ModelConfig& c = model().config();
  check_ids(batch);
  // Padded only when no graph has exactly this batch size (no copy of the batch otherwise).
  ForwardBatch padded;
  const ForwardBatch* run = &batch;
  if (bs > batch.batch_size) {
    padded = batch;
    const ForwardBatch pad = verify_padding_batch(bs - batch.batch_size, N);
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
  backend_->init_forward_metadata_replay_cuda_graph(*run);
  upload_step(verify_ws_, *run, batch.batch_size);
  graph->launch(stream_);
  const int64_t n = batch.num_tokens();
  if (r.capture != nullptr) r.capture->prepare(c.num_hidden_layers, n, c.hidden_size);
  download(verify_ws_, n, logits, r, results_hook(batch, verify_ws_, r));
  return true;
}

}  // namespace specula
