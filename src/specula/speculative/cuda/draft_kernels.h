// GPU kernels of the EAGLE tree-draft loop (CpuDraftHead::draft on the device): the draft
// head's per-row top-k over its softmax and the tree-expansion bookkeeping (candidate arrays,
// frontier rows, their branches of KV slots). The draft head's attention over a request's
// shared prefix plus the row's own branch is tree_attention
// (attention/cuda/kernels/tree_attention.h). Raw pointers only; every launch is
// graph-capturable (no allocation, no sync, no host reads) and deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

constexpr int kMaxDraftTopK = 16;

// Per row: softmax over the whole draft vocab (f32 exp, f64 sum, p = float(e / sum), as
// CpuDraftHead::top_k), then the k largest p, ties to the lower draft id (BetterScore).
struct DraftTopKParams {
  const float* logits;  // [rows, vocab]
  int64_t rows;
  int vocab;            // >= k
  int k;                // 1..kMaxDraftTopK
  const int64_t* d2t;   // [vocab] or nullptr: target id = draft id + d2t[draft id] (EAGLE-3), else the draft id
  int32_t* tokens;      // [rows, k] target ids, best first
  float* probs;         // [rows, k] their softmax probabilities
};
void draft_top_k(const DraftTopKParams& p, cudaStream_t s);

// The tree expansion state; rows = batch * k, row r = b * k + j belongs to request b.
struct DraftTreeState {
  int batch, k, num_steps, hidden;
  float* frontier_scores;     // [rows] path score (product of draft probs from the root)
  int32_t* frontier_nodes;    // [rows] candidate index of the row's node
  int32_t* row_tokens;        // [rows] the node's token: the next step's input id
  float* row_hidden;          // [rows, hidden] the next step's input hidden state
  int32_t* branch;            // [rows, num_steps] KV slots of the row's path below the root, depth 1 first
  const int32_t* step_slots;  // [num_steps - 1, batch, k]: row (b, j)'s own KV slot at step s (1-based)
  // num_candidates = k + (num_steps - 1) * k * k per request
  int32_t* cand_tokens;   // [batch, num_candidates]
  int32_t* cand_parents;  // [batch, num_candidates] (-1 for the root's children)
  float* cand_scores;     // [batch, num_candidates]
};

inline int draft_num_candidates(int k, int num_steps) { return k + (num_steps - 1) * k * k; }

// Before step 1: candidates 0..k-1 and the frontier from the root's top-k. Request b's root is
// row root_rows[b] of the root arrays (a store indexed by request), or row b when root_rows is
// nullptr.
void draft_init(const DraftTreeState& st,
                const int32_t* root_tokens,  // [root rows, k]
                const float* root_probs,     // [root rows, k]
                const float* root_hidden,    // [root rows, hidden]
                const int32_t* root_rows,    // [batch] or nullptr
                cudaStream_t s);

// The roots a draft extend produced for `batch` requests (hidden [batch, hidden], tokens and
// probs [batch, k]) into rows store_rows[b] of a root store (the arrays draft_init reads), so
// the next cycle's draft loop starts from them without a trip through the host. Requests with
// store_rows[b] < 0 (padding) store nothing.
struct DraftRootStore {
  float* hidden;    // [store rows, hidden]
  int32_t* tokens;  // [store rows, k]
  float* probs;     // [store rows, k]
  int hidden_size, k;
};
void draft_store_roots(const DraftRootStore& store, const int32_t* store_rows, int batch, const float* hidden,
                       const int32_t* tokens, const float* probs, cudaStream_t s);

// After step `step` (1 <= step <= num_steps - 1): appends each row's k children as candidates
// k + (step-1)*k*k + j*k + t and makes the request's k best children the new frontier.
// step_hidden must not alias st.row_hidden.
void draft_select(const DraftTreeState& st, int step,
                  const int32_t* child_tokens,  // [rows, k] draft_top_k of the rows' logits
                  const float* child_probs,     // [rows, k]
                  const float* step_hidden,     // [rows, hidden] the rows' outputs of this step
                  cudaStream_t s);

// draft_top_k of the rows' logits and draft_select in one launch for topk 1 (st.k == 1: one row
// per request); the same candidates, frontier and branches as the two calls.
void draft_top1_select(const DraftTreeState& st, int step, const float* logits, int vocab, const int64_t* d2t,
                       const float* step_hidden, cudaStream_t s);

// Greedy verification of chains (topk 1) on the device, and the inputs of the draft extend that
// follows the cycle. Request b's chain is verify_ids[b * n, (b + 1) * n) (the root first) and
// greedy[] the target's greedy token of each of its rows. It accepts a = 1 + the number of
// leading chain tokens equal to the greedy token of the node before them (verify_greedy's walk
// on a chain). Then ext_ids[b * n + q] is the emitted token q for q < a (chain tokens 1..a-1,
// then the bonus greedy[b * n + a - 1]; 0 when that is -1, which the host rejects), a later chain
// token (or 0) after; last_rows[b] = b * n + a - 1; and every row's captured features are copied
// to ext_features (rows past the accepted run are computed by the extend but never read).
struct ChainExtendParams {
  int batch, n;
  const int32_t* verify_ids;  // [batch * n]
  const int32_t* greedy;      // [batch * n]
  const float* features;      // [batch * n, feature_width]
  int feature_width;
  int32_t* ext_ids;           // [batch * n]
  int32_t* last_rows;         // [batch]
  float* ext_features;        // [batch * n, feature_width]
};
void chain_extend_inputs(const ChainExtendParams& p, cudaStream_t s);

}  // namespace specula::cuda_kernels
