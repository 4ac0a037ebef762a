// HybridAttentionBackend (SGLang's HybridAttnBackend): one backend serves prefill/extend,
// another serves decode. TARGET_VERIFY and DRAFT_EXTEND go to the side named by
// speculative_attention_mode ("prefill" or "decode").
#pragma once

#include <memory>

#include "specula/attention/backend.h"

namespace specula {

class HybridAttentionBackend final : public AttentionBackend {
 public:
  HybridAttentionBackend(std::unique_ptr<AttentionBackend> prefill, std::unique_ptr<AttentionBackend> decode,
                         std::string_view speculative_attention_mode);

  std::string_view name() const override { return "hybrid"; }
  void check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const override;
  void init_forward_metadata(const ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const ForwardOptions& options) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const ForwardOptions& options) override;
  void init_cuda_graph_state(int max_bs, int max_num_tokens) override;
  void init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) override;
  void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) override;
  int cuda_graph_seq_len_fill_value() const override;

  AttentionBackend& select(ForwardMode mode) const;
  AttentionBackend& prefill_backend() const { return *prefill_; }
  AttentionBackend& decode_backend() const { return *decode_; }

 private:
  std::unique_ptr<AttentionBackend> prefill_;
  std::unique_ptr<AttentionBackend> decode_;
  bool speculative_on_decode_;
};

}  // namespace specula
