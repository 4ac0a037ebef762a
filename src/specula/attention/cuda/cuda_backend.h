// CudaAttentionBackend: the AttentionBackend for NVIDIA Hopper GPUs. Same variants as the CPU
// backend (its oracle), with q / output in bf16 or f16 and a bf16, f16 or fp8-e4m3 paged cache:
// extend with cached prefix, decode (split-KV), causal and non-causal varlen, MHA/GQA/MQA,
// head_dim 64/80/96/128/256, any power-of-two page size, sliding window, local chunked
// attention, soft-cap, sinks, custom scale, TARGET_VERIFY tree masks, LSE output, fp8 descale;
// and the CUDA-graph hooks for DECODE and TARGET_VERIFY. Verify steps whose mask promises a
// visible prefix (SpecInfo::prefix_visible) attend per query over the prefix plus the tree tokens
// it sees (kernels/tree_attention), decode-like, instead of through 64-row prefill tiles.
#pragma once

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/metadata.h"

namespace specula {

// The one selection function for CUDA attention: "supported?" (empty reason) for a layer.
std::string cuda_attention_unsupported_reason(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                              int page_size);

// How a decode step's keys are split: splits per (sequence, KV-head block) and warps per block.
struct DecodePlan {
  int splits = 1;
  int warps = 4;
};

// Decode split heuristic: never splitting when the batch already fills the GPU, never below 256
// keys per split. Few (sequence, KV-head block) pairs (at most half the multiprocessors) get one
// wide block per multiprocessor; otherwise about two blocks of 4 warps per multiprocessor.
DecodePlan choose_decode_plan(int batch_size, int kv_head_blocks, int max_kv_len, int num_sms);

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

  void init_cuda_graph_state(int max_bs, int max_num_tokens) override;
  void init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) override;
  void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) override;
  int cuda_graph_seq_len_fill_value() const override { return 1; }


 private:
  struct State;  // device buffers and the host plan (cuda_backend.cpp)
  using HeadLayout = std::tuple<int, int, bool>;  // (num_q_heads, num_kv_heads, local)

  // The step's metadata: staged host-side by stage_metadata, then uploaded in one batch.
  void build_metadata(const ForwardBatch& batch, bool graph);
  void stage_metadata(const ForwardBatch& batch, bool graph);
  // Whether TARGET_VERIFY steps of this layer can attend through the tree kernel (bf16 in and out,
  // no soft-cap, sinks, window or local attention).
  static bool tree_kernel_serves(const AttentionLayer& layer, DType q_dtype, DType kv_dtype);
  DecodePlan plan_decode(int batch_size, int kv_head_blocks, int max_kv_len) const;
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options);

  AttentionBackendOptions options_;
  int num_sms_ = 0;
  int64_t l2_bytes_ = 0;
  mutable std::set<HeadLayout> layouts_;
  mutable bool all_layers_tree_ok_ = true;
  State* state_;
};

}  // namespace specula
