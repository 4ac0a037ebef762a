#include "specula/attention/double_sparsity/ds_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "specula/core/error.h"
#include "specula/core/thread_pool.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/attention/double_sparsity/ds_device_state.h"
#endif

namespace specula {

#ifndef SPECULA_HAS_CUDA
struct DoubleSparsityBackend::DeviceState {};
#endif

DoubleSparsityBackend::DoubleSparsityBackend(std::unique_ptr<AttentionBackend> dense,
                                             std::shared_ptr<const DoubleSparsityConfig> config,
                                             const AttentionBackendOptions& options)
    : dense_(std::move(dense)),
      config_(std::move(config)),
      options_(options),
      threads_(options.thread_pool != nullptr ? options.thread_pool : &default_thread_pool()) {
  SPECULA_ASSERT(dense_ && config_);
#ifdef SPECULA_HAS_CUDA
  if (options_.device.is_cuda()) device_ = std::make_unique<DeviceState>(options_.device);
#endif
}

DoubleSparsityBackend::~DoubleSparsityBackend() = default;

void DoubleSparsityBackend::check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const {
  dense_->check_layer(layer, q_dtype, kv_dtype);
  SPECULA_CHECK(layer.layer_id >= 0 && layer.layer_id < config_->num_layers(),
                "double sparsity: layer {} has no label channels; the channel config covers {} layers", layer.layer_id,
                config_->num_layers());
  SPECULA_CHECK(static_cast<int64_t>(config_->channels[static_cast<size_t>(layer.layer_id)].size()) ==
                    static_cast<int64_t>(layer.num_kv_heads) * config_->heavy_channel_num,
                "double sparsity: layer {} has {} KV heads but the channel config was read for another count",
                layer.layer_id, layer.num_kv_heads);
  SPECULA_CHECK(layer.sliding_window_size < 0 && !layer.use_local_attention &&
                    layer.attn_type == AttentionType::DECODER,
                "double sparsity serves causal full-attention layers; layer {} has a sliding window, local chunks or "
                "is non-causal",
                layer.layer_id);
  SPECULA_CHECK(layer.dca_chunk_len == 0, "double sparsity with dual chunk attention is not supported");
  SPECULA_CHECK(kv_dtype != DType::fp8_e4m3,
                "double sparsity needs a bf16, f16 or f32 KV cache (its labels are key values); got fp8_e4m3");
#ifdef SPECULA_HAS_CUDA
  if (options_.device.is_cuda()) {
    const char* problem = ds_cuda::sparse_decode_problem(layer.num_q_heads, layer.num_kv_heads, layer.head_dim,
                                                         config_->heavy_channel_num);
    SPECULA_CHECK(problem == nullptr || *problem == '\0', "double sparsity on the GPU: layer {}: {}", layer.layer_id,
                  problem);
    SPECULA_CHECK(q_dtype == kv_dtype && (q_dtype == DType::bf16 || q_dtype == DType::f16),
                  "double sparsity on the GPU needs the KV cache in the queries' dtype (bf16 or f16); got {} queries "
                  "over a {} cache",
                  dtype_name(q_dtype), dtype_name(kv_dtype));
    SPECULA_CHECK(layer.effective_v_head_dim() == layer.head_dim,
                  "double sparsity on the GPU needs v_head_dim {} equal to head_dim {}", layer.effective_v_head_dim(),
                  layer.head_dim);
  }
#endif
}

void DoubleSparsityBackend::init_forward_metadata(const ForwardBatch& batch) {
  dense_->init_forward_metadata(batch);
  sparse_ = false;
  kv_lens_.clear();
  if (batch.forward_mode == ForwardMode::DECODE) {
    kv_lens_.resize(static_cast<size_t>(batch.batch_size));
    for (int i = 0; i < batch.batch_size; ++i) {
      kv_lens_[static_cast<size_t>(i)] = batch.kv_len(i);
      sparse_ = sparse_ || kv_lens_[static_cast<size_t>(i)] >= config_->sparse_decode_threshold;
    }
  }
  if (sparse_) {
    SPECULA_CHECK(batch.req_to_token_pool != nullptr, "double sparsity: the decode batch has no req_to_token_pool");
    page_table_ = build_page_table(*batch.req_to_token_pool, batch.req_pool_indices, kv_lens_, options_.page_size);
  }
#ifdef SPECULA_HAS_CUDA
  if (options_.device.is_cuda()) device_->upload_step(batch, sparse_ ? &page_table_ : nullptr, kv_lens_, options_.cuda_stream);
#endif
}

TensorView DoubleSparsityBackend::label_buffer(const AttentionLayer& layer, const MHAKVPool& pool) {
  // One label cache per pool: a new pool (the engine's is made once) starts it afresh.
  if (labels_pool_ != &pool) {
    labels_.clear();
    labels_.resize(static_cast<size_t>(config_->num_layers()));
    labels_pool_ = &pool;
  }
  Buffer& b = labels_[static_cast<size_t>(layer.layer_id)];
  if (b.data() == nullptr) {
    // The host keeps labels in f32 (any pool dtype converts exactly), slot-major; the GPU in the
    // pool's dtype, head-major (ds_kernels.h says why).
    const bool cpu = pool.config().device.is_cpu();
    const int64_t slots = pool.num_slots(), heads = layer.num_kv_heads, C = config_->heavy_channel_num;
    b = cpu ? Buffer(DType::f32, {slots, heads, C}, pool.config().device)
            : Buffer(pool.dtype(), {heads, slots, C}, pool.config().device);
  }
  return b.view();
}

void DoubleSparsityBackend::write_labels(const AttentionLayer& layer, const ForwardBatch& batch) {
  MHAKVPool& pool = *batch.token_to_kv_pool;
  const TensorView labels = label_buffer(layer, pool);
#ifdef SPECULA_HAS_CUDA
  if (options_.device.is_cuda()) {
    device_->write_labels(layer, *config_, pool, labels, batch, options_.cuda_stream);
    return;
  }
#endif
  const TensorView k = pool.k_buffer(layer.layer_id);
  const int H = layer.num_kv_heads, D = layer.head_dim, C = config_->heavy_channel_num;
  const std::vector<int32_t>& channels = config_->channels[static_cast<size_t>(layer.layer_id)];
  const size_t elem = dtype_size(k.dtype());
  std::vector<float> row(static_cast<size_t>(H) * D);
  for (int32_t slot : batch.out_cache_loc) {
    convert_to_float(static_cast<const char*>(k.data()) + static_cast<size_t>(slot) * row.size() * elem, k.dtype(),
                     row.data(), row.size());
    float* dst = labels.data_as<float>() + static_cast<int64_t>(slot) * H * C;
    for (int h = 0; h < H; ++h) {
      for (int c = 0; c < C; ++c) dst[h * C + c] = row[static_cast<size_t>(h * D + channels[static_cast<size_t>(h * C + c)])];
    }
  }
}

void DoubleSparsityBackend::label_slots(const AttentionLayer& layer, MHAKVPool& pool,
                                        const std::vector<int32_t>& slots) {
  ForwardBatch written;
  written.token_to_kv_pool = &pool;
  written.out_cache_loc = slots;
#ifdef SPECULA_HAS_CUDA
  if (options_.device.is_cuda()) device_->upload_step(written, nullptr, {}, options_.cuda_stream);
#endif
  write_labels(layer, written);
}

void DoubleSparsityBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& out, const AttentionLayer& layer,
                                           const ForwardBatch& batch, const ForwardOptions& options) {
  dense_->forward_extend(q, k, v, out, layer, batch, options);
  // Labels follow whatever wrote the step's K: this call, or the caller before it (a GPU model's
  // fused QKV epilogue writes the cache itself and passes save_kv_cache = false).
  write_labels(layer, batch);
}

void DoubleSparsityBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& out, const AttentionLayer& layer,
                                           const ForwardBatch& batch, const ForwardOptions& options) {
  if (!sparse_) {
    dense_->forward_decode(q, k, v, out, layer, batch, options);
    write_labels(layer, batch);
    return;
  }
  MHAKVPool& pool = *batch.token_to_kv_pool;
  if (options.save_kv_cache) {
#ifdef SPECULA_HAS_CUDA
    if (options_.device.is_cuda()) {
      pool.set_kv_buffer(layer.layer_id, device_->slots_view(batch, options_.cuda_stream), k, v, options_.cuda_stream);
    } else
#endif
    {
      pool.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k, v);
    }
  }
  write_labels(layer, batch);
  if (options_.device.is_cuda()) {
    sparse_decode_cuda(q, out, layer, batch, options);
  } else {
    sparse_decode_cpu(q, out, layer, batch, options);
  }
}

void DoubleSparsityBackend::sparse_decode_cpu(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                              const ForwardBatch& batch, const ForwardOptions& options) {
  const MHAKVPool& pool = *batch.token_to_kv_pool;
  const int Hq = layer.num_q_heads, Hkv = layer.num_kv_heads, D = layer.head_dim, C = config_->heavy_channel_num;
  const int Dv = layer.effective_v_head_dim();
  const int G = Hq / Hkv;
  const float scale = layer.effective_scaling();
  const std::vector<int32_t>& channels = config_->channels[static_cast<size_t>(layer.layer_id)];
  const TensorView labels = label_buffer(layer, pool);
  const TensorView kc = pool.k_buffer(layer.layer_id), vc = pool.v_buffer(layer.layer_id);
  const float k_scale = pool.k_scale(layer.layer_id), v_scale = pool.v_scale(layer.layer_id);
  const int page_size = options_.page_size;
  SPECULA_CHECK(q.dtype() == DType::f32 && out.dtype() == DType::f32,
                "double sparsity on the CPU takes f32 queries; got {}", dtype_name(q.dtype()));

  threads_->parallel_for(static_cast<int64_t>(batch.batch_size) * Hkv, [&](int64_t item, int) {
    const int r = static_cast<int>(item / Hkv), h = static_cast<int>(item % Hkv);
    const int len = kv_lens_[static_cast<size_t>(r)];
    const int32_t* pages = page_table_.row(r);
    auto slot_of = [&](int j) { return pages[j / page_size] * page_size + j % page_size; };
    const float* qr = q.data_as<float>() + static_cast<int64_t>(r) * Hq * D;

    std::vector<int32_t> keys(static_cast<size_t>(len));
    std::iota(keys.begin(), keys.end(), 0);
    const bool dense = len < config_->sparse_decode_threshold || len <= config_->heavy_token_num;
    if (!dense) {
      std::vector<float> q_label(static_cast<size_t>(C), 0.0f);
      for (int g = 0; g < G; ++g) {
        for (int c = 0; c < C; ++c) q_label[static_cast<size_t>(c)] += qr[(h * G + g) * D + channels[static_cast<size_t>(h * C + c)]];
      }
      std::vector<float> score(static_cast<size_t>(len));
      for (int j = 0; j < len; ++j) {
        const float* lab = labels.data_as<float>() + (static_cast<int64_t>(slot_of(j)) * Hkv + h) * C;
        float s = 0.0f;
        for (int c = 0; c < C; ++c) s += q_label[static_cast<size_t>(c)] * lab[c];
        score[static_cast<size_t>(j)] = std::isnan(s) ? -INFINITY : s;  // a strict order for the selection
      }
      const auto heavy = static_cast<size_t>(config_->heavy_token_num);
      std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(heavy), keys.end(), [&](int32_t a, int32_t b) {
        const float sa = score[static_cast<size_t>(a)], sb = score[static_cast<size_t>(b)];
        return sa > sb || (sa == sb && a < b);
      });
      keys.resize(heavy);
      std::sort(keys.begin(), keys.end());
    }

    // Attention of each query head of the group over the chosen keys (f32 values, double sums).
    const size_t n = keys.size();
    std::vector<float> krow(static_cast<size_t>(D)), vrow(static_cast<size_t>(Dv));
    std::vector<double> logits(static_cast<size_t>(G) * n);
    std::vector<double> acc(static_cast<size_t>(G) * Dv, 0.0);
    for (size_t i = 0; i < n; ++i) {
      const int64_t slot = slot_of(keys[i]);
      convert_to_float(static_cast<const char*>(kc.data()) + ((slot * Hkv + h) * D) * static_cast<int64_t>(dtype_size(kc.dtype())),
                       kc.dtype(), krow.data(), krow.size());
      for (int g = 0; g < G; ++g) {
        const float* qg = qr + (h * G + g) * D;
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(qg[d]) * krow[static_cast<size_t>(d)] * k_scale;
        double s = dot * scale;
        if (layer.logit_cap > 0.0f) s = layer.logit_cap * std::tanh(s / layer.logit_cap);
        logits[static_cast<size_t>(g) * n + i] = s;
      }
    }
    for (int g = 0; g < G; ++g) {
      const int hq = h * G + g;
      double top = layer.sinks.empty() ? -INFINITY : layer.sinks[static_cast<size_t>(hq)];
      for (size_t i = 0; i < n; ++i) top = std::max(top, logits[static_cast<size_t>(g) * n + i]);
      double denom = layer.sinks.empty() ? 0.0 : std::exp(layer.sinks[static_cast<size_t>(hq)] - top);
      for (size_t i = 0; i < n; ++i) {
        double& l = logits[static_cast<size_t>(g) * n + i];
        l = std::exp(l - top);
        denom += l;
      }
      double* a = acc.data() + static_cast<size_t>(g) * Dv;
      for (size_t i = 0; i < n; ++i) {
        const int64_t slot = slot_of(keys[i]);
        convert_to_float(static_cast<const char*>(vc.data()) + ((slot * Hkv + h) * Dv) * static_cast<int64_t>(dtype_size(vc.dtype())),
                         vc.dtype(), vrow.data(), vrow.size());
        const double p = logits[static_cast<size_t>(g) * n + i] / denom;
        for (int d = 0; d < Dv; ++d) a[d] += p * vrow[static_cast<size_t>(d)] * v_scale;
      }
      float* o = out.data_as<float>() + (static_cast<int64_t>(r) * Hq + hq) * Dv;
      for (int d = 0; d < Dv; ++d) o[d] = static_cast<float>(a[d]);
      if (options.lse.data() != nullptr) {
        options.lse.data_as<float>()[static_cast<int64_t>(r) * Hq + hq] = static_cast<float>(top + std::log(denom));
      }
    }
  });
}

#ifndef SPECULA_HAS_CUDA
void DoubleSparsityBackend::sparse_decode_cuda(const TensorView&, const TensorView&, const AttentionLayer&,
                                               const ForwardBatch&, const ForwardOptions&) {
  SPECULA_CHECK(false, "double sparsity on a GPU needs a CUDA build");
}
#endif

}  // namespace specula
