// The EAGLE draft tree (SGLang's speculative/build_eagle_tree.py and the top-k expansion of
// eagle_worker.draft_forward / select_top_k_tokens), on the host, per request.
//
// Drafting with (num_steps, topk, num_draft_tokens):
//  - step 0: the root's top-k tokens become candidates 0..topk-1 (depth 1), each scored by its
//    draft probability; they are the first frontier;
//  - step i (1 <= i < num_steps): each of the topk frontier nodes gets its top-k children; a child
//    is scored parent score x child probability; candidates are numbered in the order (frontier
//    row, child rank); the topk best children (ties: lower candidate number) are the next frontier.
// All candidates compete for the tree: the root plus the num_draft_tokens - 1 best (ties: lower
// candidate number, so a parent always precedes its children), in candidate-number order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specula {

struct SpecParams {
  // Upper bounds: the GPU draft kernels' top-k width, and trees a verify step can take without
  // its per-token KV scratch and tree masks outgrowing any useful setting (SGLang's largest
  // published trees have 64 nodes).
  static constexpr int kMaxNumSteps = 32;
  static constexpr int kMaxTopk = 16;
  static constexpr int kMaxDraftTokens = 256;

  int num_steps = 0;
  int topk = 0;
  int num_draft_tokens = 0;
  // 1 <= num_steps <= kMaxNumSteps, 1 <= topk <= kMaxTopk,
  // 2 <= num_draft_tokens <= min(kMaxDraftTokens, 1 + topk + (num_steps - 1) * topk^2), and with
  // topk == 1 exactly num_steps + 1. Throws specula::Error naming the flag, value and range.
  void validate() const;
  // KV slots past a request's last token that one cycle uses (draft scratch, verify tree).
  int scratch_tokens() const;
};

// Every scored candidate of one request's draft, in candidate-number order.
struct DraftCandidates {
  std::vector<int32_t> tokens;   // target vocabulary ids
  std::vector<int32_t> parents;  // candidate number of the parent, -1 for children of the root
  std::vector<float> scores;     // product of draft probabilities along the path
  std::vector<int32_t> depths;   // 1 for the root's children
};

// Indices of the k largest scores, best first; ties go to the lower index.
std::vector<int32_t> top_k_indices(std::span<const float> scores, int k);

// One request's verify tree: node 0 is the root (the last verified token, whose KV the target has
// not computed yet), nodes 1.. the chosen candidates; parents precede children.
struct DraftTree {
  std::vector<int32_t> tokens;     // [num_draft_tokens]
  std::vector<int32_t> parents;    // [num_draft_tokens], -1 for the root
  std::vector<int32_t> depths;     // [num_draft_tokens], 0 for the root
  std::vector<int32_t> candidate;  // [num_draft_tokens], candidate number of each node (-1: root)
  // SGLang's retrieve arrays (request-local node indices, -1 = none): the first child of each
  // node (lowest index) and the next sibling (next higher index with the same parent).
  std::vector<int32_t> retrieve_next_token;
  std::vector<int32_t> retrieve_next_sibling;

  int size() const { return static_cast<int>(tokens.size()); }
};

DraftTree build_tree(int32_t root_token, const DraftCandidates& candidates, int num_draft_tokens);

// The candidates of a chain (topk 1): token i at depth i + 1, the child of candidate i - 1, all
// scored 1. Its tree (build_tree with num_draft_tokens = tokens.size() + 1) keeps them in order;
// the shape does not depend on the tokens.
DraftCandidates chain_candidates(std::span<const int32_t> tokens);

// Positions of the nodes: seq_len + depth (seq_len = tokens whose KV exists before the root).
std::vector<int32_t> tree_positions(const DraftTree& tree, int32_t seq_len);
// Full mask, u8 row-major [N, seq_len + N]: node i sees every committed token and the nodes on its
// path from the root (itself included). Appended to `mask` (requests are concatenated).
void append_tree_mask_full(const DraftTree& tree, int32_t seq_len, std::vector<uint8_t>& mask);
// The tree part only, u8 [N, N].
std::vector<uint8_t> tree_mask_qlen_only(const DraftTree& tree);
// The tree part bit-packed: row i is ceil(N / 32) words, bit j of word j / 32 set when node i
// sees node j.
std::vector<uint32_t> tree_mask_bitpacked(const DraftTree& tree);

// SGLang's retrieve_index: global row of each node in a verify batch, request b's node i at
// b * num_draft_tokens + i.
std::vector<int32_t> retrieve_index(int batch_size, int num_draft_tokens);

}  // namespace specula
