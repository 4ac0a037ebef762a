// CudaDraftHead: the draft head where a GPU target runs: EagleCudaHead (the head's launches, the
// draft loop as CUDA graphs, the root store) over a bf16 draft KV pool on the target's stream,
// and the CUDA attention backend for eager extends (prefill chunks, batches no graph holds).
#pragma once

#include <memory>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/speculative/draft_head.h"
#include "specula/speculative/eagle_cuda_head.h"

namespace specula {

class CudaDraftHead final : public DraftHead {
 public:
  CudaDraftHead(ModelRunner& target, const EagleOptions& options);
  ~CudaDraftHead() override;

  const SpecParams& params() const override { return params_; }
  int feature_size() const override { return head_->feature_size(); }
  const std::vector<int>& capture_layers() const override { return head_->capture_layers(); }
  void extend(std::span<DraftExtendItem* const> items) override;
  void draft(std::span<const DraftRequest> requests, int num_steps, std::vector<DraftCandidates>& candidates) override;
  DraftState root_on_host(int32_t req_pool_idx, const DraftState& state) const override;

  bool chains_on_device() const override { return params_.topk == 1 && params_.num_steps >= 2; }
  void launch_draft(std::span<const DraftRequest> requests, int num_steps) override;
  const int32_t* device_candidate_tokens() const override { return cuda_head_->candidate_tokens(); }
  int num_candidates() const override { return cuda_head_->num_candidates(); }
  void read_candidates(std::vector<DraftCandidates>& candidates) const override;
  bool stage_chain_extend(std::span<const DraftRequest> requests, int num_draft_tokens) override;
  void launch_chain_extend(const VerifyDeviceResults& results) override;

 private:
  std::vector<DraftLoopInput> loop_inputs(std::span<const DraftRequest> requests) const;

  ModelRunner& target_;
  SpecParams params_;
  std::unique_ptr<EagleHead> head_;
  std::unique_ptr<MHAKVPool> draft_kv_;
  std::unique_ptr<AttentionBackend> extend_backend_;
  std::unique_ptr<EagleCudaHead> cuda_head_;
};

}  // namespace specula
