// HybridAttentionBackend: routing by forward mode.

#include <memory>
#include <utility>

#include "specula/attention/hybrid_backend.h"

#include "specula/core/error.h"

namespace specula {

HybridAttentionBackend::HybridAttentionBackend(std::unique_ptr<AttentionBackend> prefill,
                                               std::unique_ptr<AttentionBackend> decode,
                                               std::string_view speculative_attention_mode)
    : prefill_(std::move(prefill)), decode_(std::move(decode)) {
  SPECULA_ASSERT(prefill_ && decode_);
  SPECULA_CHECK(speculative_attention_mode == "prefill" || speculative_attention_mode == "decode",
                "speculative_attention_mode '{}' is not valid; expected prefill or decode",
                speculative_attention_mode);
  speculative_on_decode_ = speculative_attention_mode == "decode";
}

AttentionBackend& HybridAttentionBackend::select(ForwardMode mode) const {
  switch (mode) {
    case ForwardMode::DECODE:
    case ForwardMode::IDLE: return *decode_;
    case ForwardMode::TARGET_VERIFY:
    case ForwardMode::DRAFT_EXTEND: return speculative_on_decode_ ? *decode_ : *prefill_;
    default: return *prefill_;
  }
}

void HybridAttentionBackend::check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const {
  prefill_->check_layer(layer, q_dtype, kv_dtype);
  decode_->check_layer(layer, q_dtype, kv_dtype);
}

void HybridAttentionBackend::init_forward_metadata(const ForwardBatch& batch) {
  select(batch.forward_mode).init_forward_metadata(batch);
}

void HybridAttentionBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                            const TensorView& out, const AttentionLayer& layer,
                                            const ForwardBatch& batch, const ForwardOptions& options) {
  select(batch.forward_mode).forward_extend(q, k, v, out, layer, batch, options);
}

void HybridAttentionBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                            const TensorView& out, const AttentionLayer& layer,
                                            const ForwardBatch& batch, const ForwardOptions& options) {
  decode_->forward_decode(q, k, v, out, layer, batch, options);
}

// CUDA graphs capture decode (and speculative) steps only, so the hooks go to those sides.
void HybridAttentionBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  decode_->init_cuda_graph_state(max_bs, max_num_tokens);
  if (!speculative_on_decode_) {
    prefill_->init_cuda_graph_state(max_bs, max_num_tokens);
  }
}

void HybridAttentionBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) {
  select(batch.forward_mode).init_forward_metadata_capture_cuda_graph(batch);
}

void HybridAttentionBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) {
  select(batch.forward_mode).init_forward_metadata_replay_cuda_graph(batch);
}

int HybridAttentionBackend::cuda_graph_seq_len_fill_value() const {
  return decode_->cuda_graph_seq_len_fill_value();
}

}  // namespace specula
