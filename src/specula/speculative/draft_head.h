// DraftHead: the one interface of an EAGLE draft head as the speculative worker drives it, with a
// CPU implementation (CpuDraftHead: the head in f32, its KV and attention on the host) and a GPU
// one (CudaDraftHead: the draft loop as CUDA graphs on the target's stream, roots kept on the
// device). The worker only sequences draft -> tree -> verify -> accept -> draft extend.
//
// The draft's KV pool is indexed by the same slots as the target's: the draft pair at position t
// (token t + 1, target feature of position t) lives in the slot of the target's token t.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/batch/forward_batch.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/model/eagle_head.h"
#include "specula/speculative/eagle_tree.h"
#include "specula/speculative/spec_policy.h"

namespace specula {

class ModelRunner;
class ReqToTokenPool;

struct EagleOptions {
  EagleKind kind = EagleKind::EAGLE3;
  std::filesystem::path draft_model;
  // The largest shape: with the auto policy, the head also runs it cut short (spec_policy.h).
  SpecParams params{7, 1, 8};
  SpecPolicyKind policy = SpecPolicyKind::AUTO;
  // Benchmarks: instead of draft_model, a random-weight EAGLE-3 head of the target's shape (the
  // shape of the heads published for Llama 3: model/synthetic.h).
  bool synthetic_head = false;
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
  // whose extend the device already ran (see EagleWorker::draft_extend)
  const float* features = nullptr;
  DraftState* state = nullptr;       // updated with the new root (the GPU head: marked on_device)
};

// One request of a tree expansion: its KV holds kv_len tokens and its request row maps positions
// [kv_len, kv_len + (num_steps - 1) * topk) to the expansion's scratch slots.
struct DraftRequest {
  int32_t req_pool_idx = -1;
  int kv_len = 0;
  const DraftState* state = nullptr;
};

class DraftHead {
 public:
  virtual ~DraftHead() = default;

  // The largest draft shape the head was built for (the worker checks that it drives the same
  // one); a cycle may draft fewer steps (num_steps arguments below).
  virtual const SpecParams& params() const = 0;
  // Values per token of the target features the head reads, and the target layers they come from
  // (HiddenCapture::layers).
  virtual int feature_size() const = 0;
  virtual const std::vector<int>& capture_layers() const = 0;

  // DRAFT_EXTEND over the items' pairs (a prefill chunk, or a cycle's accepted run of at most
  // num_draft_tokens pairs); each item's state gets its new root.
  virtual void extend(std::span<DraftExtendItem* const> items) = 0;
  // The tree expansion (num_steps - 1 head steps of top-k from each request's root, num_steps <=
  // params().num_steps): each request's candidates.
  virtual void draft(std::span<const DraftRequest> requests, int num_steps, std::vector<DraftCandidates>& candidates) = 0;
  // The request's root on the host (one sync for a root kept on the device; tests and tools).
  virtual DraftState root_on_host(int32_t req_pool_idx, const DraftState& state) const = 0;

  // Chains (topk 1) kept on the device, for heads that run where the target does on a GPU: the
  // expansion is launched and not waited for, and the verify reads its tokens on the device.
  virtual bool chains_on_device() const { return false; }
  // The launch (num_steps >= 2); then request b's candidate tokens are the num_candidates() int32s
  // at device_candidate_tokens() + b * num_candidates() (num_candidates() of this launch), and
  // read_candidates (after the stream's next sync) gives them on the host.
  virtual void launch_draft(std::span<const DraftRequest> requests, int num_steps);
  virtual const int32_t* device_candidate_tokens() const { return nullptr; }
  virtual int num_candidates() const { return 0; }
  virtual void read_candidates(std::vector<DraftCandidates>& candidates) const;
  // All-greedy chains of num_draft_tokens: the next draft extend staged before the verify (false:
  // not possible for this batch), then queued behind it with the accepted run found on the device.
  virtual bool stage_chain_extend(std::span<const DraftRequest> requests, int num_draft_tokens) {
    (void)requests;
    (void)num_draft_tokens;
    return false;
  }
  virtual void launch_chain_extend(const VerifyDeviceResults& results);
};

// The head of options (EAGLE or EAGLE-3 at options.draft_model) for the target, where the target
// runs: a CpuDraftHead or, on a GPU, a CudaDraftHead.
std::unique_ptr<DraftHead> make_draft_head(ModelRunner& target, const EagleOptions& options);

// What every real head builds first: the EagleHead for the target (refused at once if it does
// not fit it), a draft KV pool of kv_dtype on the target's device that shares the target's slot
// numbering, and the options of an attention backend over it on the target's stream.
struct DraftHeadParts {
  std::unique_ptr<EagleHead> head;
  std::unique_ptr<MHAKVPool> draft_kv;
  AttentionBackendOptions backend_options;
};
DraftHeadParts load_draft_head(ModelRunner& target, const EagleOptions& options, DType kv_dtype);

// The DRAFT_EXTEND batch of the items with pairs (their KV slots from req_pool), their features
// concatenated, the batch row of each one's last pair, and the items used, in batch order.
struct DraftExtendBatch {
  ForwardBatch batch;
  std::vector<float> features;
  std::vector<int64_t> last_rows;
  std::vector<DraftExtendItem*> items;
};
DraftExtendBatch make_draft_extend_batch(std::span<DraftExtendItem* const> items, ReqToTokenPool& req_pool,
                                         int feature_size);

}  // namespace specula
