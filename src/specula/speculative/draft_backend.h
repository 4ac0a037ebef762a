// DraftCascadeBackend: attention for the draft head's tree-expansion steps (SGLang's multi-step
// draft backends). A step runs one row per (request, branch): with topk > 1 each request expands
// into topk rows that share the request's committed draft KV (the prefix) and differ in their own
// few draft tokens (the branch: the node's ancestors below the root, then the node itself).
// Cascade attention, as the seed's FlashAttention backend does it: one pass over the shared
// prefix through the paged backend (no KV write), one pass over each branch through a
// page-size-1 view of the same pool (which writes the node's K/V), merged with merge_state.
// Branch slots need not be page-contiguous, so any page_size works with any topk.
#pragma once

#include <memory>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

// spec_info of a draft step's DECODE batch (rows = requests x branches).
struct DraftStepInfo : SpecInfo {
  std::vector<int32_t> prefix_req_pool_indices;  // [rows] request-table row holding the shared prefix
  std::vector<int32_t> prefix_lens;              // [rows] committed draft KV tokens of that request
  std::vector<int32_t> branch_lens;              // [rows] ancestors below the root + the node itself
  std::vector<int32_t> branch_slots;             // [sum branch_lens] KV slots, each row's own slot last
};

class DraftCascadeBackend final : public AttentionBackend {
 public:
  // backend: the name of the inner backends ("cpu", "cuda"); options.page_size is the pool's.
  DraftCascadeBackend(std::string_view backend, const AttentionBackendOptions& options, int max_rows,
                      int max_branch_len);
  std::string_view name() const override { return "draft_cascade"; }
  void check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const override;
  // batch: DECODE, one token per row, out_cache_loc = each row's own slot, spec_info a DraftStepInfo.
  void init_forward_metadata(const ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options) override;

 private:
  AttentionBackendOptions options_;
  std::unique_ptr<AttentionBackend> prefix_;
  std::unique_ptr<AttentionBackend> branch_;
  ReqToTokenPool branch_rows_;
  ForwardBatch prefix_batch_;
  ForwardBatch branch_batch_;
  Buffer branch_out_;   // the branch pass's output
  Buffer lse_scratch_;  // prefix LSE | branch LSE | merged LSE when the caller wants none
};

}  // namespace specula
