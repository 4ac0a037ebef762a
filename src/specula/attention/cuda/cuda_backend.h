// CudaAttentionBackend: the AttentionBackend for NVIDIA Hopper GPUs. Same variants as the CPU
// backend (its oracle), with q / output in bf16 or f16 and a bf16, f16 or fp8-e4m3 paged cache:
// extend with cached prefix, decode (split-KV), dual chunk attention (decode in one kernel, extend
// as passes: dual_chunk_plan.h), causal and non-causal varlen, MHA/GQA/MQA,
// head_dim 64/80/96/128/256, any power-of-two page size, sliding window, local chunked
// attention, soft-cap, sinks, custom scale, TARGET_VERIFY tree masks, LSE output, fp8 descale;
// and the CUDA-graph hooks for DECODE and TARGET_VERIFY. Verify steps whose mask promises a
// visible prefix (SpecInfo::prefix_visible) attend per query over the prefix plus the tree tokens
// it sees (kernels/tree_attention), decode-like, instead of through 128-row prefill tiles; EAGLE's
// draft tree steps attend through the same kernel (forward_draft_tree).
//
// Which kernel serves a call is answered by one selection function per operation
// (select_cuda_decode / _extend / _verify / _draft_tree): check_layer, the step's metadata
// planning, the workspace sizing and the launches all go through them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/metadata.h"
#include "specula/attention/cuda/cuda_attention_select.h"

namespace specula {

class CudaAttentionBackend final : public AttentionBackend {
 public:
  explicit CudaAttentionBackend(const AttentionBackendOptions& options);
  ~CudaAttentionBackend() override;

  std::string_view name() const override { return "cuda"; }
  void check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const override;
  void init_forward_metadata(const ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const ForwardOptions& options) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const ForwardOptions& options) override;
  void forward_draft_tree(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                          MHAKVPool& kv_pool, const DraftTreeView& tree) override;

  void init_cuda_graph_state(int max_bs, int max_num_tokens) override;
  void init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) override;
  void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) override;
  int cuda_graph_seq_len_fill_value() const override { return 1; }

 private:
  struct State;      // device buffers and the host plan (cuda_backend.cpp)
  struct Sequences;  // a step's per-sequence lengths and page table, host-side (cuda_backend.cpp)
  using HeadLayout = std::tuple<int, int, int, bool>;  // (num_q_heads, num_kv_heads, head_dim, local)
  // A checked layer of each head layout, kept to plan decode steps for every layout up front.
  struct CheckedLayer {
    AttentionLayer layer;
    DType q_dtype;
    DType kv_dtype;
  };

  CudaAttentionShape base_shape() const;
  CudaAttentionShape decode_shape(int batch_size, int64_t num_tokens, int max_kv_len) const;
  // Every checked layout's decode plan for a step of this shape, and the workspace they share.
  std::map<HeadLayout, DecodePlan> plan_decode_step(const CudaAttentionShape& shape, DecodeWorkspace& workspace) const;

  // The step's metadata: staged host-side, then uploaded in one batch.
  void build_metadata(const ForwardBatch& batch, bool graph);
  void stage_metadata(const ForwardBatch& batch, bool graph);
  void begin_step(const ForwardBatch& batch, bool graph);
  Sequences stage_sequences(const ForwardBatch& batch, bool graph);
  void stage_decode(int batch_size, bool graph);
  void stage_prefill_items(const std::vector<int32_t>& q_lens);
  void stage_tree_mask(const ForwardBatch& batch, const Sequences& seqs, bool graph);
  void stage_tree_rows(const ForwardBatch& batch, const Sequences& seqs, const std::vector<int64_t>& mask_offsets);
  void stage_local_batches(const Sequences& seqs);
  void stage_dual_chunk(const Sequences& seqs);

  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options);
  void check_forward_args(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                          const MHAKVPool& pool, const ForwardOptions& options) const;
  // The layer's sinks on the device (uploaded once per layer and set of values), or nullptr.
  const float* device_sinks(const AttentionLayer& layer);
  void launch_tree(const TensorView& q, const TensorView& out, const AttentionLayer& layer, const MHAKVPool& pool,
                   const DraftTreeView& tree, const ForwardOptions& options);
  void run_decode(const TensorView& q, const TensorView& out, const AttentionLayer& layer, const MHAKVPool& pool,
                  const ForwardOptions& options);
  void run_dual_chunk(const TensorView& q, const TensorView& out, const AttentionLayer& layer, const MHAKVPool& pool,
                      const ForwardOptions& options);
  void select_dual_chunk_keys(const TensorView& q, const AttentionLayer& layer, const MHAKVPool& pool);
  void run_prefill(const CudaAttentionPlan& plan, const TensorView& q, const TensorView& out,
                   const AttentionLayer& layer, const MHAKVPool& pool, const ForwardOptions& options);

  AttentionBackendOptions options_;
  int num_sms_ = 0;
  int64_t l2_bytes_ = 0;
  mutable std::map<HeadLayout, CheckedLayer> layouts_;
  mutable bool all_layers_tree_ok_ = true;
  // The dual chunk setting of the checked layers (0: none), planned for in extend-like steps.
  mutable int dca_chunk_len_ = 0;
  mutable int dca_original_max_ = 0;
  mutable std::optional<DualChunkSparsePattern> dca_sparse_;  // its sparse pattern (thresholds), if any
  State* state_;
};

}  // namespace specula
