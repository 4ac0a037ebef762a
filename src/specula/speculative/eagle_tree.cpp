// The EAGLE draft tree on the host: parameter rules, the top-k used for drafting, the choice of
// the num_draft_tokens - 1 best candidates, and the per-request tree layouts the verify pass needs
// (positions, attention masks in three forms, SGLang's retrieve arrays).
#include "specula/speculative/eagle_tree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "specula/core/error.h"

namespace specula {

namespace {

// Best first; equal scores go to the lower index. Together with scores that never grow along a
// path (a child is its parent's score times a probability), this puts a parent before its
// children in every selection.
struct BetterScore {
  std::span<const float> scores;
  bool operator()(int32_t a, int32_t b) const {
    const float sa = scores[static_cast<size_t>(a)];
    const float sb = scores[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  }
};

// The layout functions walk parents upwards; they need a root at 0 and parents before children
// (which also rules out cycles).
void check_tree_parents(const DraftTree& tree) {
  const int n = tree.size();
  SPECULA_CHECK(n >= 1, "a draft tree needs at least its root node");
  SPECULA_CHECK(tree.parents.size() == tree.tokens.size() && tree.depths.size() == tree.tokens.size(),
                "draft tree arrays disagree: {} tokens, {} parents, {} depths", tree.tokens.size(),
                tree.parents.size(), tree.depths.size());
  SPECULA_CHECK(tree.parents[0] == -1, "draft tree node 0 must be the root (parent -1), not a child of {}",
                tree.parents[0]);
  for (int i = 1; i < n; ++i) {
    const int32_t p = tree.parents[static_cast<size_t>(i)];
    SPECULA_CHECK(p >= 0 && p < i, "draft tree node {} has parent {}: it must be in [0, {})", i, p, i);
  }
}

// Row i, column j of the [N, N] tree mask: 1 when node j is on node i's path from the root. A row
// is its parent's row plus its own diagonal, because parents precede children.
std::vector<uint8_t> ancestor_matrix(const DraftTree& tree) {
  check_tree_parents(tree);
  const size_t n = static_cast<size_t>(tree.size());
  std::vector<uint8_t> m(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = tree.parents[i];
    if (p >= 0) {
      std::copy_n(m.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(p) * n), i,
                  m.begin() + static_cast<std::ptrdiff_t>(i * n));
    }
    m[i * n + i] = 1;
  }
  return m;
}

}  // namespace

void SpecParams::validate() const {
  SPECULA_CHECK(num_steps >= 1 && num_steps <= kMaxNumSteps,
                "--speculative-num-steps {} is not valid: it must be in [1, {}]", num_steps, kMaxNumSteps);
  SPECULA_CHECK(topk >= 1 && topk <= kMaxTopk, "--speculative-eagle-topk {} is not valid: it must be in [1, {}]", topk,
                kMaxTopk);
  if (topk == 1) {
    // A chain has exactly one candidate per step, so every candidate is in the tree (SGLang's rule).
    SPECULA_CHECK(num_draft_tokens == num_steps + 1,
                  "--speculative-num-draft-tokens {} is not valid for --speculative-num-steps {} and "
                  "--speculative-eagle-topk 1: it must be {}",
                  num_draft_tokens, num_steps, num_steps + 1);
    return;
  }
  const int64_t k = topk;
  const int64_t max_draft =
      std::min<int64_t>(kMaxDraftTokens, 1 + k + (static_cast<int64_t>(num_steps) - 1) * k * k);
  SPECULA_CHECK(num_draft_tokens >= 2 && num_draft_tokens <= max_draft,
                "--speculative-num-draft-tokens {} is not valid for --speculative-num-steps {} and "
                "--speculative-eagle-topk {}: it must be in [2, {}]",
                num_draft_tokens, num_steps, topk, max_draft);
}

int SpecParams::scratch_tokens() const { return std::max(num_draft_tokens, (num_steps - 1) * topk); }

std::vector<int32_t> top_k_indices(std::span<const float> scores, int k) {
  SPECULA_CHECK(k >= 0, "top-k of {} is not valid: k must be >= 0", k);
  // NaN has no place in the ordering (it would break the strict weak order of the sort).
  for (size_t i = 0; i < scores.size(); ++i) {
    SPECULA_CHECK(!std::isnan(scores[i]), "draft score {} is NaN", i);
  }
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t keep = std::min(order.size(), static_cast<size_t>(k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    BetterScore{scores});
  order.resize(keep);
  return order;
}

DraftCandidates chain_candidates(std::span<const int32_t> tokens) {
  DraftCandidates c;
  for (size_t i = 0; i < tokens.size(); ++i) {
    c.tokens.push_back(tokens[i]);
    c.parents.push_back(static_cast<int32_t>(i) - 1);
    c.scores.push_back(1.0f);
    c.depths.push_back(static_cast<int32_t>(i) + 1);
  }
  return c;
}

DraftTree build_tree(int32_t root_token, const DraftCandidates& candidates, int num_draft_tokens) {
  const size_t num_candidates = candidates.tokens.size();
  SPECULA_CHECK(candidates.parents.size() == num_candidates && candidates.scores.size() == num_candidates &&
                    candidates.depths.size() == num_candidates,
                "draft candidate arrays disagree: {} tokens, {} parents, {} scores, {} depths", num_candidates,
                candidates.parents.size(), candidates.scores.size(), candidates.depths.size());
  SPECULA_CHECK(num_draft_tokens >= 1, "num_draft_tokens {} is not valid: the tree has at least its root",
                num_draft_tokens);
  SPECULA_CHECK(num_candidates >= static_cast<size_t>(num_draft_tokens - 1),
                "{} draft candidates cannot fill a tree of num_draft_tokens {}: at least {} are needed", num_candidates,
                num_draft_tokens, num_draft_tokens - 1);
  for (size_t c = 0; c < num_candidates; ++c) {
    const int32_t p = candidates.parents[c];
    SPECULA_CHECK(p >= -1 && p < static_cast<int32_t>(c),
                  "draft candidate {} has parent {}: it must be -1 (the root) or an earlier candidate", c, p);
    const int32_t expected_depth = p < 0 ? 1 : candidates.depths[static_cast<size_t>(p)] + 1;
    SPECULA_CHECK(candidates.depths[c] == expected_depth, "draft candidate {} has depth {}; its parent implies {}", c,
                  candidates.depths[c], expected_depth);
  }

  std::vector<int32_t> chosen = top_k_indices(candidates.scores, num_draft_tokens - 1);
  std::sort(chosen.begin(), chosen.end());

  const size_t n = static_cast<size_t>(num_draft_tokens);
  DraftTree tree;
  tree.tokens.assign(n, -1);
  tree.parents.assign(n, -1);
  tree.depths.assign(n, 0);
  tree.candidate.assign(n, -1);
  tree.retrieve_next_token.assign(n, -1);
  tree.retrieve_next_sibling.assign(n, -1);
  tree.tokens[0] = root_token;

  std::vector<int32_t> node_of_candidate(num_candidates, -1);
  std::vector<int32_t> last_child(n, -1);
  for (size_t i = 1; i < n; ++i) {
    const int32_t c = chosen[i - 1];
    const size_t cu = static_cast<size_t>(c);
    const int32_t parent_candidate = candidates.parents[cu];
    int32_t parent = 0;
    if (parent_candidate >= 0) {
      parent = node_of_candidate[static_cast<size_t>(parent_candidate)];
      // Only scores that grow along a path (bad input, not a product of probabilities) get here.
      SPECULA_CHECK(parent >= 0,
                    "draft candidate {} (score {}) was chosen but its parent candidate {} (score {}) was not: a "
                    "child's score must not exceed its parent's",
                    c, candidates.scores[cu], parent_candidate,
                    candidates.scores[static_cast<size_t>(parent_candidate)]);
    }
    const int32_t node = static_cast<int32_t>(i);
    node_of_candidate[cu] = node;
    tree.tokens[i] = candidates.tokens[cu];
    tree.parents[i] = parent;
    tree.depths[i] = candidates.depths[cu];
    tree.candidate[i] = c;
    // Nodes arrive in increasing index, so the first child seen is the lowest and siblings chain
    // upwards.
    const size_t pu = static_cast<size_t>(parent);
    if (last_child[pu] < 0) {
      tree.retrieve_next_token[pu] = node;
    } else {
      tree.retrieve_next_sibling[static_cast<size_t>(last_child[pu])] = node;
    }
    last_child[pu] = node;
  }
  return tree;
}

std::vector<int32_t> tree_positions(const DraftTree& tree, int32_t seq_len) {
  check_tree_parents(tree);
  SPECULA_CHECK(seq_len >= 0, "seq_len {} is not valid: it must be >= 0", seq_len);
  std::vector<int32_t> positions(tree.depths.size());
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = seq_len + tree.depths[i];
  return positions;
}

void append_tree_mask_full(const DraftTree& tree, int32_t seq_len, std::vector<uint8_t>& mask) {
  SPECULA_CHECK(seq_len >= 0, "seq_len {} is not valid: it must be >= 0", seq_len);
  const std::vector<uint8_t> tree_part = ancestor_matrix(tree);
  const size_t n = static_cast<size_t>(tree.size());
  const size_t prefix = static_cast<size_t>(seq_len);
  mask.reserve(mask.size() + n * (prefix + n));
  for (size_t i = 0; i < n; ++i) {
    mask.insert(mask.end(), prefix, uint8_t{1});
    mask.insert(mask.end(), tree_part.begin() + static_cast<std::ptrdiff_t>(i * n),
                tree_part.begin() + static_cast<std::ptrdiff_t>((i + 1) * n));
  }
}

std::vector<uint8_t> tree_mask_qlen_only(const DraftTree& tree) { return ancestor_matrix(tree); }

std::vector<uint32_t> tree_mask_bitpacked(const DraftTree& tree) {
  const std::vector<uint8_t> tree_part = ancestor_matrix(tree);
  const size_t n = static_cast<size_t>(tree.size());
  const size_t words = (n + 31) / 32;
  std::vector<uint32_t> packed(n * words, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (tree_part[i * n + j] != 0) packed[i * words + j / 32] |= uint32_t{1} << (j % 32);
    }
  }
  return packed;
}

std::vector<int32_t> retrieve_index(int batch_size, int num_draft_tokens) {
  SPECULA_CHECK(batch_size >= 0, "batch_size {} is not valid: it must be >= 0", batch_size);
  SPECULA_CHECK(num_draft_tokens >= 1, "num_draft_tokens {} is not valid: it must be >= 1", num_draft_tokens);
  const int64_t total = static_cast<int64_t>(batch_size) * num_draft_tokens;
  SPECULA_CHECK(total <= std::numeric_limits<int32_t>::max(), "a verify batch of {} x {} nodes does not fit int32 row indices", batch_size,
                num_draft_tokens);
  std::vector<int32_t> index(static_cast<size_t>(total));
  std::iota(index.begin(), index.end(), 0);
  return index;
}

}  // namespace specula
