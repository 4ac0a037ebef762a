// EagleWorker (SGLang's speculative/eagle_worker.py): the draft head, its KV cache and its
// attention, and one speculative cycle over a batch of decoding requests:
//   draft (num_steps steps of top-k expansion from each request's root) -> build the trees ->
//   one TARGET_VERIFY forward of the target over all trees with tree masks -> greedy or
//   sampling verification -> the accepted path's target KV moved into place.
// The caller (the scheduler) owns the requests' KV slots: it gives each request
// scratch_tokens() slots past its KV before a cycle, emits the accepted tokens (applying stop
// conditions), frees the slots it does not keep, and then calls draft_extend on the survivors,
// which also runs after every prefill chunk.
//
// The draft's KV pool is indexed by the same slots as the target's: the draft pair at position t
// (token t + 1, target feature of position t) lives in the slot of the target's token t.
// The draft head runs where the target runs: on the CPU in f32 (its pool and attention too), or
// on the target's GPU (EagleCudaHead: the draft loop as CUDA graphs, a bf16 pool).
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "specula/kv/mha_kv_pool.h"
#include "specula/model/eagle_head.h"
#include "specula/runner/model_runner.h"
#include "specula/runner/sampler.h"
#include "specula/speculative/draft_backend.h"
#include "specula/speculative/eagle_tree.h"
#include "specula/speculative/verify.h"

namespace specula {

struct EagleOptions {
  EagleKind kind = EagleKind::EAGLE3;
  std::filesystem::path draft_model;
  SpecParams params{7, 1, 8};
};

// What the draft knows about a request between cycles: its root (the last draft pair). The CPU
// head keeps it here; the GPU head keeps it in its root store on the device (on_device).
struct DraftState {
  std::vector<float> root_hidden;     // [hidden] the head's output at the root
  std::vector<int32_t> root_tokens;   // [topk] the root's top-k tokens (target ids), best first
  std::vector<float> root_probs;      // [topk] their draft probabilities
  bool on_device = false;
  bool valid() const { return on_device || !root_tokens.empty(); }
};

// Draft pairs [start, start + next_tokens.size()) of one request.
struct DraftExtendItem {
  int32_t req_pool_idx = -1;
  int start = 0;
  std::vector<int32_t> next_tokens;  // the token after each pair's position
  // [next_tokens.size(), feature_size] target features; may be null for the requests of a cycle
  // whose extend the device already ran (see draft_extend)
  const float* features = nullptr;
  DraftState* state = nullptr;       // updated with the new root (the GPU head: marked on_device)
};

struct CycleItem {
  // In: a decoding request whose KV holds kv_len tokens, whose last token (root_token) has no KV
  // yet, and whose request row maps positions [kv_len, kv_len + scratch_tokens()) to free slots.
  int32_t req_pool_idx = -1;
  int kv_len = 0;
  int32_t root_token = -1;
  DraftState* state = nullptr;
  Sampler* sampler = nullptr;
  // Out: the tree, the verification and the target features of the accepted nodes
  // ([accepted_nodes.size(), feature_size]; empty when the device already ran the draft extend);
  // the accepted nodes' target KV now sits at positions [kv_len, kv_len + accepted_nodes.size()).
  DraftTree tree;
  VerifyResult result;
  std::vector<float> accepted_features;
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

class EagleCudaHead;

class EagleWorker {
 public:
  EagleWorker(ModelRunner& target, const EagleOptions& options);
  ~EagleWorker();

  const SpecParams& params() const { return options_.params; }
  const EagleHead& head() const { return *head_; }
  // Slots past its KV a request needs during a cycle (draft scratch and the verify tree).
  int scratch_tokens() const;
  // What the target's prefill forwards must capture.
  const std::vector<int>& capture_layers() const { return head_->capture_layers(); }

  // After a prefill chunk, or right after run_cycle for its surviving requests (those whose
  // extend the device already ran, for all-greedy chains on the GPU, are only marked).
  void draft_extend(std::span<DraftExtendItem> items);
  // The request's root on the host: `state` itself for the CPU head, its row of the GPU head's
  // root store otherwise (one sync; for tests and tools).
  DraftState root_on_host(int32_t req_pool_idx, const DraftState& state) const;
  void run_cycle(std::span<CycleItem> items);
  const SpecTiming& timing() const { return timing_; }

 private:
  void draft_steps(std::span<CycleItem> items, std::vector<DraftCandidates>& candidates);
  // The target's TARGET_VERIFY over the items' trees, then verification and the KV moves.
  // tokens_on_device: the trees hold the shape only; their tokens are the GPU draft loop's
  // candidates, read on the device by the verify and on the host (fill_chains) after it.
  // extend_on_device: the draft extend after the cycle is queued on the device behind the verify
  // (EagleCudaHead::launch_chain_extend; staged already), and draft_extend skips these requests.
  void verify(std::span<CycleItem> items, bool tokens_on_device = false, bool extend_on_device = false);
  void extend_now(std::span<DraftExtendItem> items);
  // Chains (topk 1) on the GPU head skip the host between the draft loop and the verify.
  bool chain_on_device() const;
  void fill_chains(std::span<CycleItem> items);
  // Softmax over the draft vocabulary and the top-k, as target ids.
  void top_k(const float* logits, std::vector<int32_t>& tokens, std::vector<float>& probs) const;

  ModelRunner& target_;
  EagleOptions options_;
  std::unique_ptr<EagleHead> head_;
  std::unique_ptr<MHAKVPool> draft_kv_;
  std::unique_ptr<AttentionBackend> extend_backend_;
  std::unique_ptr<DraftCascadeBackend> step_backend_;  // CPU head
  std::unique_ptr<EagleCudaHead> cuda_head_;           // GPU head
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
