// DoubleSparsityBackend on the GPU: the per-step uploads, the label writes and the sparse decode's
// launch (kernels in ds_kernels.cu).
#include <cuda_runtime_api.h>

#include "specula/attention/double_sparsity/ds_device_state.h"
#include "specula/core/cuda_check.h"
#include "specula/kv/mha_kv_pool.h"

namespace specula {

DoubleSparsityBackend::DeviceState::DeviceState(Device d) : device(d), uploads(d) {
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, d.index));
}

void DoubleSparsityBackend::DeviceState::upload_step(const ForwardBatch& batch, const PageTable* table,
                                                     const std::vector<int32_t>& lens, void* stream) {
  slots.upload(batch.out_cache_loc, device, uploads);
  num_slots = batch.num_tokens();
  if (table != nullptr) {
    pages.upload(table->pages, device, uploads);
    kv_lens.upload(lens, device, uploads);
  }
  uploads.flush(static_cast<cudaStream_t>(stream));
}

TensorView DoubleSparsityBackend::DeviceState::slots_view(const ForwardBatch& batch, void*) {
  SPECULA_CHECK(num_slots == batch.num_tokens(), "double sparsity: the step's slots were uploaded for {} tokens, not {}",
                num_slots, batch.num_tokens());
  return slots.view(num_slots);
}

const int32_t* DoubleSparsityBackend::DeviceState::channels(const DoubleSparsityConfig& config, int layer,
                                                            void* stream) {
  auto [it, fresh] = layer_channels.try_emplace(layer);
  if (fresh) {
    it->second.upload(config.channels[static_cast<size_t>(layer)], device, uploads);
    uploads.flush(static_cast<cudaStream_t>(stream));
  }
  return it->second.data();
}

const float* DoubleSparsityBackend::DeviceState::sinks(const AttentionLayer& layer, void* stream) {
  if (layer.sinks.empty()) return nullptr;
  auto [it, fresh] = layer_sinks.try_emplace(layer.layer_id);
  if (fresh) {
    it->second.upload(layer.sinks, device, uploads);
    uploads.flush(static_cast<cudaStream_t>(stream));
  }
  return it->second.data();
}

void DoubleSparsityBackend::DeviceState::write_labels(const AttentionLayer& layer, const DoubleSparsityConfig& config,
                                                      const MHAKVPool& pool, const TensorView& labels,
                                                      const ForwardBatch& batch, void* stream) {
  const TensorView slot_view = slots_view(batch, stream);
  ds_cuda::LabelWrite p;
  p.k_cache = pool.k_buffer(layer.layer_id).data();
  p.labels = labels.data();
  p.slots = slot_view.data_as<int32_t>();
  p.channels = channels(config, layer.layer_id, stream);
  p.n = num_slots;
  p.label_slots = pool.num_slots();
  p.kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.channels_per_head = config.heavy_channel_num;
  if (p.n > 0) ds_cuda::write_labels(p, stream);
}

void DoubleSparsityBackend::sparse_decode_cuda(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                               const ForwardBatch& batch, const ForwardOptions& options) {
  const MHAKVPool& pool = *batch.token_to_kv_pool;
  SPECULA_CHECK(q.dtype() == pool.dtype() && (q.dtype() == DType::bf16 || q.dtype() == DType::f16),
                "double sparsity on the GPU needs bf16 or f16 queries of the KV cache's dtype; got {} over {}",
                dtype_name(q.dtype()), dtype_name(pool.dtype()));
  SPECULA_CHECK(q.is_contiguous() && out.is_contiguous(), "double sparsity on the GPU needs contiguous q {} and output {}",
                q.str(), out.str());
  DeviceState& d = *device_;
  ds_cuda::SparseDecode p;
  p.q = q.data();
  p.k_cache = pool.k_buffer(layer.layer_id).data();
  p.v_cache = pool.v_buffer(layer.layer_id).data();
  p.labels = label_buffer(layer, pool).data();
  p.label_slots = pool.num_slots();
  p.channels = d.channels(*config_, layer.layer_id, options_.cuda_stream);
  p.pages = d.pages.data();
  p.kv_lens = d.kv_lens.data();
  p.sinks = d.sinks(layer, options_.cuda_stream);
  p.out = out.data();
  p.lse = options.lse.data() != nullptr ? options.lse.data_as<float>() : nullptr;
  p.f16 = q.dtype() == DType::f16;
  p.batch = batch.batch_size;
  p.q_heads = layer.num_q_heads;
  p.kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.channels_per_head = config_->heavy_channel_num;
  p.max_pages = page_table_.max_pages;
  p.page_size = options_.page_size;
  p.max_kv_len = *std::max_element(kv_lens_.begin(), kv_lens_.end());
  p.heavy_token_num = config_->heavy_token_num;
  p.sparse_decode_threshold = config_->sparse_decode_threshold;
  p.scale = layer.effective_scaling();
  p.logit_cap = layer.logit_cap;
  const ds_cuda::SparseDecodeWorkspace ws =
      ds_cuda::sparse_decode_workspace(p.batch, p.q_heads, p.kv_heads, p.head_dim, p.max_kv_len, p.heavy_token_num,
                                       p.sparse_decode_threshold, d.num_sms);
  d.scores.reserve(ws.scores, d.device);
  d.selected.reserve(ws.selected, d.device);
  d.partial.reserve(ws.partial, d.device);
  d.counters.reserve_zeroed(ws.counters, d.device, static_cast<cudaStream_t>(options_.cuda_stream));
  p.scores = d.scores.data();
  p.selected = d.selected.data();
  p.partial = d.partial.data();
  p.counters = d.counters.data();
  p.splits = ws.splits;
  p.num_sms = d.num_sms;
  ds_cuda::sparse_decode(p, options_.cuda_stream);
}

}  // namespace specula
