// CudaMlaBackend: MLA attention on Hopper in the absorbed form (kernels/mla_attention), bf16
// queries and outputs over bf16 or fp8_ds_mla latent caches at kv_lora_rank 512 + rope 64: decode,
// extend with a cached prefix (causal tile skipping; prefix_chunk_tokens bounds the keys one pass
// takes, passes merged by the split combine), TARGET_VERIFY causal (MTP) and with tree masks that
// show the whole prefix (EAGLE), sparse top-k with sinks, LSE, the lightning indexer, and the
// CUDA-graph hooks. The CPU MLA backend is its oracle.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "specula/attention/mla/mla_backend.h"

namespace specula {

// Whether the expanded form (MlaExtendForm) costs less than the absorbed one for an extend step
// of these requests, per head: absorbed, 2 (2 x 512 + 64) FLOPs per (query, key) pair on the MLA
// kernel plus the f32 W_UK / W_UV products per query token; expanded, 2 (qk + v) per pair on the
// MHA kernel plus the f32 kv_b_proj product per cached row. The rates are measured ones (H200).
bool prefer_expanded(const std::vector<int32_t>& kv_lens, const std::vector<int32_t>& q_lens, int qk_nope_head_dim,
                     int v_head_dim);

// Splits of the key range per (unit, row block): about two work items per multiprocessor, never
// below one 64-key tile per split (small batches are latency-bound: more splits, fewer serial
// tiles per block), at most 64; and at least ceil(max_keys / chunk_tokens) when
// chunk_tokens > 0 (the chunked-prefix bound).
int choose_mla_splits(int64_t base_items, int max_keys, int num_sms, int chunk_tokens);

class CudaMlaBackend final : public MlaAttentionBackend {
 public:
  explicit CudaMlaBackend(const MlaBackendOptions& options);
  ~CudaMlaBackend() override;

  std::string_view name() const override { return "cuda"; }
  void check_layer(const MlaLayer& layer, DType q_dtype, MlaKVFormat kv_format) const override;
  void init_forward_metadata(const ForwardBatch& batch) override;
  bool expanded_step() const override;
  void forward_expanded(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe, const TensorView& out,
                        const MlaLayer& layer, const ForwardBatch& batch, const MlaExpandFn& expand,
                        const MlaForwardOptions& options) override;
  void forward(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe, const TensorView& out,
               const MlaLayer& layer, const ForwardBatch& batch, const MlaForwardOptions& options) override;
  void indexer_topk(const TensorView& q, const TensorView& weights, const TensorView& index_k, const MlaLayer& layer,
                    const ForwardBatch& batch, const TensorView& out, bool save_index_k) override;

  void init_cuda_graph_state(int max_bs, int max_num_tokens) override;
  void init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) override;
  void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) override;

 private:
  struct State;  // device buffers and the step's plan (cuda_mla_backend.cpp)

  void build_metadata(const ForwardBatch& batch, bool graph);
  void check_tensors(const TensorView& q, const TensorView& out, const MlaLayer& layer, int q_width, int out_width,
                     const MlaForwardOptions& options) const;
  const float* device_sinks(const MlaLayer& layer) const;

  MlaBackendOptions options_;
  int num_sms_ = 0;
  mutable int num_q_heads_ = 0;  // every layer of one backend has the same head count
  mutable MlaLayer widths_;      // the expanded form's widths (the same for every layer)
  mutable std::string expanded_problem_ = "no layer was checked";
  std::unique_ptr<State> state_;
};

}  // namespace specula
