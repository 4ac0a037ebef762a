// Verification of a draft tree against the target's outputs at every node (SGLang's
// verify_tree_greedy and tree_speculative_sampling_target_only).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "specula/speculative/eagle_tree.h"

namespace specula {

struct VerifyResult {
  std::vector<int32_t> accepted_nodes;   // node indices of the accepted path, root (0) first
  std::vector<int32_t> accepted_tokens;  // tokens of accepted_nodes[1..] (the draft tokens kept)
  int32_t bonus_token = -1;              // the target's token after the last accepted node
};

// Greedy: from the root, follow the child whose token equals the target's argmax at the current
// node (children tried first-child, then siblings); the argmax where no child matches is the bonus.
// target_argmax: [N], the target's greedy token at each node.
VerifyResult verify_greedy(const DraftTree& tree, std::span<const int32_t> target_argmax);

// Lossless tree speculative sampling with a deterministic draft: at the current node with target
// distribution p, the children are tried in order; child token t is accepted with probability
// p(t) / sum(p) (u < p(t) / sum(p)); a rejected token's mass is removed (p(t) = 0, the residual)
// before the next sibling; when no child is accepted the bonus token is drawn from the residual.
// The emitted tokens are then distributed exactly as sampling the target token by token.
// target_probs: [N, vocab], each row the target's sampling distribution at that node
// (temperature, top-k, top-p, min-p applied, summing to 1). uniform() returns doubles in [0, 1).
VerifyResult verify_sampling(const DraftTree& tree, std::span<const float> target_probs, int vocab,
                             const std::function<double()>& uniform);

}  // namespace specula
