// CpuDraftHead: an EagleHead executed on the CPU in f32, with its f32 KV pool, an extend backend
// and the draft cascade backend for the tree expansion (a shared prefix plus each row's branch).
// The roots live in each request's DraftState.
#pragma once

#include <memory>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/speculative/draft_backend.h"
#include "specula/speculative/draft_head.h"

namespace specula {

class CpuDraftHead final : public DraftHead {
 public:
  CpuDraftHead(ModelRunner& target, const EagleOptions& options);

  const SpecParams& params() const override { return params_; }
  int feature_size() const override { return head_->feature_size(); }
  const std::vector<int>& capture_layers() const override { return head_->capture_layers(); }
  void extend(std::span<DraftExtendItem* const> items) override;
  void draft(std::span<const DraftRequest> requests, int num_steps, std::vector<DraftCandidates>& candidates) override;
  DraftState root_on_host(int32_t, const DraftState& state) const override { return state; }

 private:
  // Softmax over the draft vocabulary and the top-k, as target ids.
  void top_k(const float* logits, std::vector<int32_t>& tokens, std::vector<float>& probs) const;

  ModelRunner& target_;
  SpecParams params_;
  std::unique_ptr<EagleHead> head_;
  std::unique_ptr<MHAKVPool> draft_kv_;
  std::unique_ptr<AttentionBackend> extend_backend_;
  std::unique_ptr<DraftCascadeBackend> step_backend_;
  std::vector<float> logits_;
};

}  // namespace specula
