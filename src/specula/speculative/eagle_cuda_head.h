// EagleCudaHead: the tree-draft loop on the device, over the head's GPU forward (EagleCudaModel in
// model/) and a bf16 draft KV pool; attention through the CUDA attention backend (eager extends,
// and forward_draft_tree for the loop's and the graphed extend's rows).
//   - extend(): DRAFT_EXTEND through the CUDA attention backend (eagerly: prefill chunks of any
//     length), then the top-k of each request's last row: the roots of the next cycle, which stay
//     on the device in a root store indexed by request (SGLang keeps them in its spec_info too).
//   - extend_after_cycle(): the same after a cycle, as a CUDA graph per batch size, each request's
//     accepted pairs padded to num_draft_tokens rows (the tree kernel with causal branches). It
//     is launched and not waited for: the host goes on while the head runs.
//   - draft_loop(): num_steps - 1 head steps over batch x topk rows, each followed by the top-k
//     of every row and the selection of each request's topk best children (kernels in
//     speculative/cuda), with the draft's attention over the shared prefix plus the row's branch.
//     One CUDA graph per batch size (SGLang's EAGLEDraftCudaGraphRunner), padded; larger batches
//     run the same launches eagerly. Only the candidate arrays come back to the host, in one
//     download; launch_draft_loop/read_draft_candidates split it so that the next launches
//     (the verify, which reads the candidates' tokens on the device) queue behind the loop.
//     Chains (topk 1) select with one fused kernel per step (draft_top1_select).
//   - stage_chain_extend()/launch_chain_extend(): for all-greedy chains, the extend after a cycle
//     queued behind the verify, its accepted run found on the device (chain_extend_inputs).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/core/cuda_graph.h"
#include "specula/core/pinned_buffer.h"
#include "specula/core/tensor.h"
#include "specula/model/eagle_cuda.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/model/eagle_head.h"
#include "specula/speculative/eagle_tree.h"
#include "specula/speculative/spec_policy.h"

namespace specula {


// One request of a draft loop: its KV length, its request row (req_to_token; positions
// [kv_len, kv_len + (num_steps - 1) * topk) are the loop's scratch slots) and its index in the
// request pool, whose root the last extend left in the root store.
struct DraftLoopInput {
  int kv_len = 0;
  const int32_t* req_row = nullptr;
  int32_t req_pool_idx = -1;
};

// One request's draft pairs after a cycle: len <= num_draft_tokens pairs at positions
// [start, start + len), tokens[i] the token after position start + i, features [len, feature_size].
struct DraftExtendInput {
  int start = 0;
  int len = 0;
  int32_t req_pool_idx = -1;
  const int32_t* req_row = nullptr;
  const int32_t* tokens = nullptr;
  const float* features = nullptr;
};

struct EagleCudaHeadOptions {
  int page_size = 1;
  int max_context_len = 0;
  int max_batch = 1;                  // requests per loop
  int num_req_rows = 1;               // rows of the request pool (the root store has one more, for padding)
  std::vector<int> graph_batch_sizes;  // empty: no graphs
  int32_t padding_slot = -1;           // a KV slot padding rows may write (graphs only)
  // The shapes cycles may run, cut short from the head's params (spec_policy.h): the draft loop
  // is captured for each step count >= 2 among them and the extend graphs for each draft-token
  // count >= 2. Empty: the params' shape only.
  std::vector<SpecShape> shapes;
};

class EagleCudaHead {
 public:
  // draft_kv: the head's bf16 pool on the head's device; stream: the target's cudaStream_t.
  // backend: the CUDA attention backend over draft_kv (eager extends and the draft tree steps).
  EagleCudaHead(const EagleHead& head, const SpecParams& params, MHAKVPool& draft_kv, AttentionBackend& backend,
                void* stream, const EagleCudaHeadOptions& options);
  ~EagleCudaHead();
  EagleCudaHead(const EagleCudaHead&) = delete;
  EagleCudaHead& operator=(const EagleCudaHead&) = delete;

  // DRAFT_EXTEND over the batch (backend metadata initialised for it; its pool is the draft pool)
  // with target features [num_tokens, feature_size] on the host. For each of last_rows: the head's
  // hidden state [hidden] and its top-k (target ids, probabilities) go into the root store at the
  // matching request pool index (req_pool_indices).
  void extend(const ForwardBatch& batch, const float* features,
              const std::vector<int32_t>& last_rows, const std::vector<int32_t>& req_pool_indices);

  // The draft extend after a cycle as a CUDA graph (SGLang's draft-extend graph runner): each
  // request's pairs padded to num_draft_tokens rows, attending over its prefix plus its own new
  // pairs causally; the roots go into the root store. False (nothing run) when no graph holds the
  // batch; then use extend().
  bool extend_after_cycle(std::span<const DraftExtendInput> requests);

  // The extend after an all-greedy chain cycle (topk 1), queued before the host knows the
  // outcome. stage_chain_extend (before the verify is launched) stages each request's
  // num_draft_tokens rows (the cycle's, one of the captured counts) as if the whole chain were
  // accepted; false (nothing staged) when no
  // extend graph holds the batch. launch_chain_extend (on the stream, behind the verify) takes the
  // accepted run, the extend's ids and the captured features from the verify's results on the
  // device (chain_extend_inputs) and replays the graph: the same extend, roots in the store, as
  // extend_after_cycle over the accepted tokens.
  bool stage_chain_extend(std::span<const DraftLoopInput> requests, int num_draft_tokens);
  void launch_chain_extend(const VerifyDeviceResults& results);

  // Row req_pool_idx of the root store on the host (one sync; for tests and tools).
  void read_root(int32_t req_pool_idx, std::vector<float>& hidden, std::vector<int32_t>& tokens,
                 std::vector<float>& probs);

  // The tree expansion of every request over num_steps (<= the params'); fills each request's
  // candidates (tokens, parents, scores, depths), as CpuDraftHead::draft does.
  void draft_loop(std::span<const DraftLoopInput> requests, int num_steps, std::vector<DraftCandidates>& candidates);
  // draft_loop in two halves: the launch (the loop and the candidates' download queued on the
  // stream, nothing waited for), and, after the caller has synchronised the stream, the
  // candidates of the last launch's requests. In between, the loop's candidate tokens can feed
  // the next launches on the stream: request b's are the num_candidates() int32s at
  // candidate_tokens() + b * num_candidates() (num_steps >= 2; num_candidates() of this launch).
  void launch_draft_loop(std::span<const DraftLoopInput> requests, int num_steps);
  void read_draft_candidates(std::vector<DraftCandidates>& candidates) const;
  const int32_t* candidate_tokens() const { return cands_.data_as<const int32_t>(); }
  int num_candidates() const;

 private:
  // The head's own slots, after the model's (EagleCudaModel::Slot).
  enum Slot : size_t {
    kIds = EagleCudaModel::kCallerSlots, kPos, kFeatures, kRowIds, kNormed, kTopTokens, kTopProbs, kNumSlots
  };
  static_assert(kNumSlots <= EagleCudaModel::kMaxSlots);
  static constexpr size_t kX = EagleCudaModel::kX;
  static constexpr size_t kLogits = EagleCudaModel::kLogits;
  using Workspace = EagleCudaModel::Workspace;

  Buffer& scratch(Workspace& ws, Slot slot, DType dtype, int64_t elements);
  // A request pool index this head's root store holds; what names the operation in the error.
  void check_req_row(const char* what, int32_t req_pool_idx) const;
  // EagleCudaModel::forward; kv_slots (device, [n]) or nullptr: the q/k/v epilogue writes K/V
  // into the draft pool there, and attend must not write them again.
  void forward(Workspace& ws, int64_t n, const int32_t* ids, const int32_t* positions, const float* hidden_in,
               bool from_target, const CudaAttend& attend, const int32_t* row_ids, int64_t rows,
               const int32_t* kv_slots = nullptr);
  // Attends each row (its K/V already in the draft pool) over its sequence's prefix plus its
  // branch (AttentionBackend::forward_draft_tree): the draft loop's and the graphed extend's
  // attention.
  void attend_tree(const TensorView& q, const TensorView& out, int rows_per_seq, const int32_t* pages,
                   const int32_t* prefix_lens, const int32_t* branch, int branch_stride, int branch_len,
                   const int32_t* branch_lens);
  // Softmax and top-k (target ids, best first) of `rows` rows of draft logits, on the device.
  void top_k(const float* logits, int64_t rows, int32_t* tokens, float* probs);
  // The launches of a loop of `batch` requests over S steps whose inputs are staged
  // (graph-capturable).
  void loop_launches(Workspace& ws, int batch, int S);
  // Fill and upload the staged inputs of a loop / graphed extend of bs requests: `requests`
  // first, padding requests after them (valid slots and pages; what graphs are captured with).
  void stage_loop(std::span<const DraftLoopInput> requests, int bs, int S);
  // N rows per request; features false: leave the requests' feature rows to the device
  // (launch_chain_extend).
  void stage_extend(std::span<const DraftExtendInput> requests, int bs, int N, bool features = true);
  struct LoopLayout;
  LoopLayout layout(int batch, int S) const;
  struct ExtendLayout;
  ExtendLayout extend_layout(int batch, int N) const;
  void extend_launches(Workspace& ws, int batch, int N);
  // The extend graph of N rows per request that holds `batch` requests, if captured.
  std::pair<int, const CudaGraph*> extend_graph(int N, int batch) const;
  // The roots of `rows` requests (kNormed, kTopTokens, kTopProbs of ws) into the root store at
  // store_rows (device).
  void store_roots(Workspace& ws, const int32_t* store_rows, int rows);
  // The store row padding requests of a loop read: zero from the start (valid token ids), never
  // written.
  int padding_root_row() const { return options_.num_req_rows; }

  const EagleHead& head_;
  SpecParams params_;
  MHAKVPool& draft_kv_;
  AttentionBackend& backend_;
  void* stream_;
  EagleCudaHeadOptions options_;
  std::unique_ptr<EagleCudaModel> model_;
  int page_stride_ = 0;
  Workspace extend_ws_, loop_ws_, extend_graph_ws_;
  // The loop's device state (sized for max_batch) and its staged inputs.
  Buffer loop_ints_;
  // The root store: each request's root (hidden, top-k tokens and probabilities) by request
  // pool index, written by the extends and read by the draft loop.
  Buffer roots_hidden_, roots_tokens_, roots_probs_, extend_rows_;
  Buffer frontier_scores_, frontier_nodes_, row_tokens_, row_hidden_, branch_;
  Buffer cands_;  // [3, cand_pitch_]: the candidates' tokens, parents and scores (f32 bits)
  int64_t cand_pitch_ = 0;
  PinnedBuffer pinned_;  // downloads
  int loop_requests_ = 0;  // requests of the last launch_draft_loop
  int loop_steps_ = 0;     // and its steps
  int chain_extend_requests_ = 0;  // requests of the staged chain extend (0: none)
  int chain_extend_tokens_ = 0;    // and its rows per request
  std::vector<int32_t> host_ints_;
  std::vector<float> host_floats_;
  std::map<int, CudaGraphSet> loop_graphs_;  // the draft loop, by steps
  Buffer ext_ints_, ext_floats_;  // the extend graphs' staged inputs
  std::map<int, CudaGraphSet> extend_graphs_;  // by rows per request
};

}  // namespace specula
