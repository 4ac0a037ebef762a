// Verification of one request's draft tree on the host: the greedy walk and lossless tree
// speculative sampling (the rejection scheme of SGLang's tree_speculative_sampling_target_only
// for a deterministic draft), both following the retrieve arrays from the root.
#include "specula/speculative/verify.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "specula/core/error.h"

namespace specula {

namespace {

// The walks follow retrieve_next_token / retrieve_next_sibling; both point to higher node indices
// in a tree from build_tree, which is what makes every walk end.
void check_walkable(const DraftTree& tree) {
  const int n = tree.size();
  SPECULA_CHECK(n >= 1, "a draft tree needs at least its root node");
  SPECULA_CHECK(tree.retrieve_next_token.size() == tree.tokens.size() &&
                    tree.retrieve_next_sibling.size() == tree.tokens.size(),
                "draft tree arrays disagree: {} tokens, {} retrieve_next_token, {} retrieve_next_sibling",
                tree.tokens.size(), tree.retrieve_next_token.size(), tree.retrieve_next_sibling.size());
  for (int i = 0; i < n; ++i) {
    const int32_t child = tree.retrieve_next_token[static_cast<size_t>(i)];
    const int32_t sibling = tree.retrieve_next_sibling[static_cast<size_t>(i)];
    SPECULA_CHECK(child == -1 || (child > i && child < n),
                  "draft tree node {} has first child {}: it must be -1 or in ({}, {})", i, child, i, n);
    SPECULA_CHECK(sibling == -1 || (sibling > i && sibling < n),
                  "draft tree node {} has next sibling {}: it must be -1 or in ({}, {})", i, sibling, i, n);
  }
}

void accept(VerifyResult& result, const DraftTree& tree, int32_t node) {
  result.accepted_nodes.push_back(node);
  result.accepted_tokens.push_back(tree.tokens[static_cast<size_t>(node)]);
}

// Inverse-CDF draw from the residual p (not normalised; sum is its exact total).
int32_t sample_residual(std::span<const double> p, double sum, std::span<const float> original_row, double u) {
  if (!(sum > 0.0)) {
    // Unreachable for a proper distribution: a child holding all the remaining mass is always
    // accepted, so some mass survives every rejection. Stay deterministic if it ever happens.
    return static_cast<int32_t>(std::max_element(original_row.begin(), original_row.end()) - original_row.begin());
  }
  const double target = u * sum;
  double cumulative = 0.0;
  int32_t last_positive = -1;
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] <= 0.0) continue;
    cumulative += p[v];
    last_positive = static_cast<int32_t>(v);
    if (target < cumulative) return last_positive;
  }
  // u * sum can round up to sum itself; the draw then belongs to the last token with mass.
  return last_positive;
}

}  // namespace

VerifyResult verify_greedy(const DraftTree& tree, std::span<const int32_t> target_argmax) {
  check_walkable(tree);
  SPECULA_CHECK(target_argmax.size() == tree.tokens.size(),
                "target_argmax has {} tokens; the draft tree has {} nodes", target_argmax.size(), tree.tokens.size());
  VerifyResult result;
  result.accepted_nodes.push_back(0);
  int32_t node = 0;
  while (true) {
    const int32_t wanted = target_argmax[static_cast<size_t>(node)];
    int32_t child = tree.retrieve_next_token[static_cast<size_t>(node)];
    while (child != -1 && tree.tokens[static_cast<size_t>(child)] != wanted) {
      child = tree.retrieve_next_sibling[static_cast<size_t>(child)];
    }
    if (child == -1) {
      result.bonus_token = wanted;
      return result;
    }
    accept(result, tree, child);
    node = child;
  }
}

VerifyResult verify_sampling(const DraftTree& tree, std::span<const float> target_probs, int vocab,
                             const std::function<double()>& uniform) {
  check_walkable(tree);
  SPECULA_CHECK(vocab >= 1, "vocab {} is not valid: it must be >= 1", vocab);
  const size_t v_size = static_cast<size_t>(vocab);
  const size_t n = tree.tokens.size();
  SPECULA_CHECK(target_probs.size() == n * v_size,
                "target_probs has {} values; a tree of {} nodes over vocab {} needs {}", target_probs.size(), n,
                vocab, n * v_size);
  for (size_t i = 1; i < n; ++i) {
    SPECULA_CHECK(tree.tokens[i] >= 0 && tree.tokens[i] < vocab,
                  "draft tree node {} has token {}: it must be in [0, {})", i, tree.tokens[i], vocab);
  }
  SPECULA_CHECK(static_cast<bool>(uniform), "verify_sampling needs a uniform() source");
  const auto draw = [&uniform] {
    const double u = uniform();
    SPECULA_CHECK(u >= 0.0 && u < 1.0, "uniform() returned {}: it must be in [0, 1)", u);
    return u;
  };

  VerifyResult result;
  result.accepted_nodes.push_back(0);
  // The residual in double: removing rejected mass from float rows would otherwise lose it to
  // rounding when the remaining mass is small.
  std::vector<double> p(v_size);
  int32_t node = 0;
  while (true) {
    const std::span<const float> row = target_probs.subspan(static_cast<size_t>(node) * v_size, v_size);
    double sum = 0.0;
    for (size_t v = 0; v < v_size; ++v) {
      SPECULA_CHECK(std::isfinite(row[v]) && row[v] >= 0.0f,
                    "target_probs[{}, {}] is {}: probabilities must be finite and >= 0", node, v, row[v]);
      p[v] = row[v];
      sum += p[v];
    }
    SPECULA_CHECK(sum > 0.0, "target_probs row {} has no probability mass", node);

    int32_t next = -1;
    for (int32_t child = tree.retrieve_next_token[static_cast<size_t>(node)]; child != -1;
         child = tree.retrieve_next_sibling[static_cast<size_t>(child)]) {
      const size_t token = static_cast<size_t>(tree.tokens[static_cast<size_t>(child)]);
      const double mass = p[token];
      const double u = draw();
      // A token holding all the remaining mass is accepted whatever u, so rounding in u * sum
      // cannot reject it and leave an empty residual.
      if (mass > 0.0 && (mass >= sum || u * sum < mass)) {
        next = child;
        break;
      }
      p[token] = 0.0;
      // Recomputed, not decremented: a running difference can keep a rounding residue of mass
      // that no token holds. O(vocab) per rejection, at most topk per accepted level.
      sum = std::accumulate(p.begin(), p.end(), 0.0);
    }
    if (next == -1) {
      result.bonus_token = sample_residual(p, sum, row, draw());
      return result;
    }
    accept(result, tree, next);
    node = next;
  }
}

}  // namespace specula
