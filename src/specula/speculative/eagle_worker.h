// EagleWorker (SGLang's speculative/eagle_worker.py): one speculative cycle over a batch of
// decoding requests, with a DraftHead (which owns the head, its KV cache and its attention):
//   draft (num_steps steps of top-k expansion from each request's root) -> build the trees ->
//   one TARGET_VERIFY forward of the target over all trees with tree masks -> greedy or
//   sampling verification -> the accepted path's target KV moved into place.
// The caller (the scheduler) owns the requests' KV slots: it gives each request
// scratch_tokens() slots past its KV before a cycle, emits the accepted tokens (applying stop
// conditions), frees the slots it does not keep, and then calls draft_extend on the survivors,
// which also runs after every prefill chunk.
// The draft head (speculative/draft_head.h) runs where the target runs; the worker only
// sequences a cycle and never asks which head it holds.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specula/runner/model_runner.h"
#include "specula/runner/sampler.h"
#include "specula/speculative/draft_head.h"
#include "specula/speculative/eagle_tree.h"
#include "specula/speculative/spec_policy.h"
#include "specula/speculative/verify.h"

namespace specula {

struct CycleItem {
  // In: a decoding request whose KV holds kv_len tokens, whose last token (root_token) has no KV
  // yet, and whose request row maps positions [kv_len, kv_len + scratch_tokens()) to free slots.
  int32_t req_pool_idx = -1;
  int kv_len = 0;
  int32_t root_token = -1;
  DraftState* state = nullptr;
  Sampler* sampler = nullptr;
  // -1: none; N >= 0: the target's log-probability of each emitted token (accepted draft tokens,
  // then the bonus) and its N most likely tokens, from the verify's rows (as plain decoding
  // reports them: the log-softmax of the raw logits).
  int logprobs = -1;
  // Out: the tree, the verification and the target features of the accepted nodes
  // ([accepted_nodes.size(), feature_size]; empty when the device already ran the draft extend);
  // the accepted nodes' target KV now sits at positions [kv_len, kv_len + accepted_nodes.size()).
  DraftTree tree;
  VerifyResult result;
  std::vector<float> accepted_features;
  std::vector<TokenLogprobs> emitted_logprobs;  // with logprobs >= 0: one per emitted token
  // Out: why this request alone could not be verified (its grammar hit a limit); the result then
  // holds the root only and the request must end with the reason.
  std::string error;
};

// Where a cycle's time goes (host wall clock, summed over cycles). The host waits for the GPU
// only where the verify's results come back, so GPU work queued but not waited for shows in the
// phase that waits for it.
struct SpecTiming {
  int64_t cycles = 0;
  // The head over accepted tokens (and prefill chunks); the GPU head's extend after a cycle is
  // launched and not waited for, so this is its host time and its GPU time lands in draft_steps_s
  // (for chains on the GPU head, whose draft loop is not waited for either, in verify_s).
  double draft_extend_s = 0;
  double draft_steps_s = 0;   // tree expansion: num_steps - 1 head forwards and top-k
  double verify_s = 0;        // building the trees and the target's TARGET_VERIFY forward
  double accept_s = 0;        // verification and moving the accepted KV
};

class EagleWorker {
 public:
  // The head of options.draft_model (make_draft_head).
  EagleWorker(ModelRunner& target, const EagleOptions& options);
  // A head built elsewhere (tests' fake heads).
  EagleWorker(ModelRunner& target, std::unique_ptr<DraftHead> head, const SpecParams& params,
              SpecPolicyKind policy = SpecPolicyKind::FIXED);
  ~EagleWorker();

  // The largest shape; cycles run one of policy().shapes().
  const SpecParams& params() const { return params_; }
  SpecPolicy& policy() { return policy_; }
  const SpecPolicy& policy() const { return policy_; }
  const DraftHead& head() const { return *head_; }
  DraftHead& head() { return *head_; }
  // Slots past its KV a request needs during a cycle (draft scratch and the verify tree).
  int scratch_tokens() const { return params_.scratch_tokens(); }
  // What the target's prefill forwards must capture.
  const std::vector<int>& capture_layers() const { return head_->capture_layers(); }

  // After a prefill chunk, or right after run_cycle for its surviving requests (those whose
  // extend the device already ran, for all-greedy chains on the GPU, are only marked).
  void draft_extend(std::span<DraftExtendItem> items);
  // The request's root on the host (DraftHead::root_on_host).
  DraftState root_on_host(int32_t req_pool_idx, const DraftState& state) const {
    return head_->root_on_host(req_pool_idx, state);
  }
  // A cycle of `shape` (one of policy().shapes() but "off", which the scheduler runs as a plain
  // decode step).
  void run_cycle(std::span<CycleItem> items, const SpecShape& shape);
  // A cycle of the largest shape.
  void run_cycle(std::span<CycleItem> items) { run_cycle(items, SpecShape{params_.num_steps, params_.num_draft_tokens}); }
  const SpecTiming& timing() const { return timing_; }

 private:
  // The target's TARGET_VERIFY over the items' trees, then verification and the KV moves.
  // tokens_on_device: the trees hold the shape only; their tokens are the head's device chain
  // candidates, read on the device by the verify and on the host (fill_chains) after it.
  // extend_on_device: the draft extend after the cycle is queued on the device behind the verify
  // (DraftHead::launch_chain_extend; staged already), and draft_extend skips these requests.
  // N: the trees' tokens per request.
  void verify(std::span<CycleItem> items, int N, bool tokens_on_device = false, bool extend_on_device = false);
  // A cycle of chains kept on the device (DraftHead::chains_on_device).
  void run_device_chain_cycle(std::span<CycleItem> items, const SpecShape& shape);
  void fill_chains(std::span<CycleItem> items, int N);

  ModelRunner& target_;
  SpecParams params_;
  std::unique_ptr<DraftHead> head_;
  SpecPolicy policy_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_ids_;  // the verify's argmax per tree token in all-greedy cycles
  // The last cycle's requests whose draft extend the device ran, with the run it accepted.
  struct DeviceExtended {
    int32_t req_pool_idx;
    int start;      // the request's KV length before the cycle
    size_t tokens;  // accepted draft tokens + the bonus
  };
  std::vector<DeviceExtended> extended_;
  SpecTiming timing_;
};

}  // namespace specula
