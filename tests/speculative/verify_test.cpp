// Tree verification: the greedy walk on hand-worked argmax arrays, the rejection scheme step by
// step with scripted uniforms, losslessness of tree sampling by chi-square tests against the
// target rows, agreement of sampling with greedy on one-hot targets, and bad input.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/speculative/eagle_tree.h"
#include "speculative/spec_fixtures.h"
#include "specula/speculative/verify.h"

namespace specula {
namespace {

using Ints = std::vector<int32_t>;

using spec_fixtures::add_candidate;

// Root token 7:
//   0 (7) ─┬─ 1 (11) ── 3 (21) ── 5 (33)
//          └─ 2 (12) ── 4 (23)
DraftTree greedy_tree() {
  DraftCandidates c;
  add_candidate(c, 11, -1, 0.5f);
  add_candidate(c, 12, -1, 0.375f);
  add_candidate(c, 21, 0, 0.25f);
  add_candidate(c, 23, 1, 0.28125f);
  add_candidate(c, 33, 2, 0.21875f);
  const DraftTree tree = build_tree(7, c, 6);
  EXPECT_EQ(tree.tokens, (Ints{7, 11, 12, 21, 23, 33}));
  EXPECT_EQ(tree.parents, (Ints{-1, 0, 0, 1, 2, 3}));
  return tree;
}

TEST(VerifyGreedy, AcceptsAFullPath) {
  const DraftTree tree = greedy_tree();
  // Entries off the path (nodes 2, 4) hold draft tokens too, to catch reads of the wrong row.
  const Ints argmax{11, 21, 23, 33, 12, 99};
  const VerifyResult r = verify_greedy(tree, argmax);
  EXPECT_EQ(r.accepted_nodes, (Ints{0, 1, 3, 5}));
  EXPECT_EQ(r.accepted_tokens, (Ints{11, 21, 33}));
  EXPECT_EQ(r.bonus_token, 99);
}

TEST(VerifyGreedy, AcceptsThroughTheSecondChild) {
  const DraftTree tree = greedy_tree();
  const Ints argmax{12, 21, 23, 33, 5, 33};
  const VerifyResult r = verify_greedy(tree, argmax);
  EXPECT_EQ(r.accepted_nodes, (Ints{0, 2, 4}));
  EXPECT_EQ(r.accepted_tokens, (Ints{12, 23}));
  EXPECT_EQ(r.bonus_token, 5);
}

TEST(VerifyGreedy, AcceptsNothingWhenNoChildMatches) {
  const DraftTree tree = greedy_tree();
  const Ints argmax{40, 21, 23, 33, 12, 99};
  const VerifyResult r = verify_greedy(tree, argmax);
  EXPECT_EQ(r.accepted_nodes, (Ints{0}));
  EXPECT_TRUE(r.accepted_tokens.empty());
  EXPECT_EQ(r.bonus_token, 40);
}

TEST(VerifyGreedy, NeverAcceptsADescendantOfARejectedNode) {
  const DraftTree tree = greedy_tree();
  // Node 3 (21) is a child of node 1, not of the accepted node 2: 21 is the bonus.
  const VerifyResult via_other_branch = verify_greedy(tree, Ints{12, 21, 21, 33, 12, 99});
  EXPECT_EQ(via_other_branch.accepted_nodes, (Ints{0, 2}));
  EXPECT_EQ(via_other_branch.accepted_tokens, (Ints{12}));
  EXPECT_EQ(via_other_branch.bonus_token, 21);
  // A grandchild's token at the root is not a child of the root.
  const VerifyResult grandchild = verify_greedy(tree, Ints{21, 21, 23, 33, 12, 99});
  EXPECT_EQ(grandchild.accepted_nodes, (Ints{0}));
  EXPECT_EQ(grandchild.bonus_token, 21);
}

// A uniform() that replays a script and counts the draws.
struct ScriptedUniform {
  std::vector<double> values;
  size_t used = 0;
  double operator()() {
    EXPECT_LT(used, values.size()) << "more uniforms drawn than scripted";
    return used < values.size() ? values[used++] : 0.0;
  }
};

// Root 0 with children node 1 (token 0) and node 2 (token 1), vocab 4.
//   root row [.5, .3, .2, 0]; node 1 row uniform; node 2 row one-hot at 3.
struct TwoChildren {
  DraftTree tree;
  std::vector<float> probs;
  TwoChildren() {
    DraftCandidates c;
    add_candidate(c, 0, -1, 0.5f);
    add_candidate(c, 1, -1, 0.3f);
    tree = build_tree(2, c, 3);
    probs = {0.5f, 0.3f, 0.2f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f, 0.0f, 0.0f, 0.0f, 1.0f};
  }
  VerifyResult run(std::vector<double> script) const {
    ScriptedUniform u{std::move(script)};
    const VerifyResult r = verify_sampling(tree, probs, 4, [&u] { return u(); });
    EXPECT_EQ(u.used, u.values.size()) << "fewer uniforms drawn than scripted";
    return r;
  }
};

TEST(VerifySampling, RejectionUsesTheResidual) {
  const TwoChildren t;
  // Token 0: .6 * 1 >= .5, rejected. Residual [0, .3, .2, 0], sum .5: token 1 is accepted when
  // u * .5 < .3; u = .5 gives .25 (without the residual, .5 * 1 >= .3 would reject it).
  const VerifyResult second = t.run({0.6, 0.5, 0.3});
  EXPECT_EQ(second.accepted_nodes, (Ints{0, 2}));
  EXPECT_EQ(second.accepted_tokens, (Ints{1}));
  EXPECT_EQ(second.bonus_token, 3);  // node 2's row is one-hot at 3

  // u = .7: .35 >= .3, rejected; the residual holds only token 2, whatever the last uniform.
  for (double last : {0.0, 0.5, 0.9999}) {
    const VerifyResult none = t.run({0.6, 0.7, last});
    EXPECT_EQ(none.accepted_nodes, (Ints{0}));
    EXPECT_TRUE(none.accepted_tokens.empty());
    EXPECT_EQ(none.bonus_token, 2);
  }

  // u = .4 < .5 accepts token 0; node 1 is a leaf, its bonus by inverse CDF: .6 falls in [.5, .75).
  const VerifyResult first = t.run({0.4, 0.6});
  EXPECT_EQ(first.accepted_nodes, (Ints{0, 1}));
  EXPECT_EQ(first.accepted_tokens, (Ints{0}));
  EXPECT_EQ(first.bonus_token, 2);
  EXPECT_EQ(t.run({0.4, 0.0}).bonus_token, 0);
  EXPECT_EQ(t.run({0.4, 0.9999}).bonus_token, 3);
}

TEST(VerifySampling, CertainChildIsAlwaysAcceptedAndImpossibleTokenNever) {
  // Chain 0 -> 1 (token 3) -> 2 (token 1), vocab 5. Root row one-hot at 3 (scaled, not summing to
  // 1, to check normalisation), node 1 row one-hot at 1, node 2 row spread.
  DraftCandidates c;
  add_candidate(c, 3, -1, 0.5f);
  add_candidate(c, 1, 0, 0.25f);
  const DraftTree chain = build_tree(0, c, 3);
  const std::vector<float> probs{0, 0, 0, 0.3f, 0, 0, 1, 0, 0, 0, 0.5f, 0, 0, 0.25f, 0.25f};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const double last = std::nextafter(1.0, 0.0);
    const bool extreme = i % 2 == 0;
    const auto uniform = [&] { return extreme ? last : static_cast<double>(rng() >> 11) * 0x1.0p-53; };
    const VerifyResult r = verify_sampling(chain, probs, 5, uniform);
    ASSERT_EQ(r.accepted_tokens, (Ints{3, 1})) << "draw " << i;
    ASSERT_TRUE(r.bonus_token == 0 || r.bonus_token == 3 || r.bonus_token == 4) << r.bonus_token;
  }

  // Root row gives token 3 no mass: the child is rejected even with u = 0 (0 < 0 is false), and
  // the bonus never is 3.
  const std::vector<float> zero_child{0.5f, 0.5f, 0, 0, 0, 0, 1, 0, 0, 0, 0.5f, 0, 0, 0.25f, 0.25f};
  for (int i = 0; i < 2000; ++i) {
    const bool extreme = i % 2 == 0;
    const auto uniform = [&] { return extreme ? 0.0 : static_cast<double>(rng() >> 11) * 0x1.0p-53; };
    const VerifyResult r = verify_sampling(chain, zero_child, 5, uniform);
    ASSERT_EQ(r.accepted_nodes, (Ints{0})) << "draw " << i;
    ASSERT_TRUE(r.bonus_token == 0 || r.bonus_token == 1) << r.bonus_token;
  }
}

// 0.999 quantiles of chi-square with 1..10 degrees of freedom.
constexpr std::array<double, 10> kChiSquare999{10.828, 13.816, 16.266, 18.467, 20.515,
                                               22.458, 24.322, 26.124, 27.877, 29.588};

// Goodness of fit of counts to a target row (normalised here). Cells with zero probability must
// stay empty and are left out of the statistic.
void expect_distribution(const std::vector<int64_t>& counts, std::span<const float> row, const std::string& label) {
  SCOPED_TRACE(label);
  int64_t total = 0;
  for (int64_t x : counts) total += x;
  double mass = 0.0;
  for (float p : row) mass += p;
  ASSERT_GT(total, 0);
  double statistic = 0.0;
  int cells = 0;
  for (size_t v = 0; v < counts.size(); ++v) {
    if (row[v] == 0.0f) {
      EXPECT_EQ(counts[v], 0) << "token " << v << " has zero target probability";
      continue;
    }
    const double expected = static_cast<double>(total) * row[v] / mass;
    ASSERT_GE(expected, 5.0) << "token " << v << ": too few samples for the chi-square approximation";
    const double diff = static_cast<double>(counts[v]) - expected;
    statistic += diff * diff / expected;
    ++cells;
  }
  ASSERT_GE(cells, 2);
  EXPECT_LT(statistic, kChiSquare999[static_cast<size_t>(cells - 2)])
      << "chi-square " << statistic << " with " << cells - 1 << " degrees of freedom over " << total << " samples";
}

TEST(VerifySampling, EmittedTokensFollowTheTarget) {
  // vocab 6. Root children: node 1 (token 2), node 2 (token 4), node 3 (token 0); node 1 has
  // children node 4 (token 1) and node 5 (token 2).
  //   0 ─┬─ 1 (2) ─┬─ 4 (1)
  //      │         └─ 5 (2)
  //      ├─ 2 (4)
  //      └─ 3 (0)
  constexpr int kVocab = 6;
  DraftCandidates c;
  add_candidate(c, 2, -1, 0.5f);
  add_candidate(c, 4, -1, 0.25f);
  add_candidate(c, 0, -1, 0.125f);
  add_candidate(c, 1, 0, 0.25f);
  add_candidate(c, 2, 0, 0.125f);
  const DraftTree tree = build_tree(5, c, 6);
  ASSERT_EQ(tree.tokens, (Ints{5, 2, 4, 0, 1, 2}));
  ASSERT_EQ(tree.parents, (Ints{-1, 0, 0, 0, 1, 1}));

  // Fixed seed so the statistical checks are reproducible (each fails by chance with p = .001).
  const uint64_t seed = 20240611;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto uniform = [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };

  // Random rows with forced zeros: the root gives no mass to draft token 4 (node 2 can never be
  // accepted) nor to token 3; node 1 gives none to its own child's token 2 (node 5) nor to 5;
  // node 4 none to 1; node 3 none to 0.
  const std::vector<std::vector<int>> zeros{{3, 4}, {2, 5}, {}, {0}, {1}, {}};
  std::vector<float> probs(6 * kVocab);
  for (size_t node = 0; node < 6; ++node) {
    double sum = 0.0;
    std::vector<double> row(kVocab);
    for (double& x : row) sum += x = 0.05 + uniform();
    for (int z : zeros[node]) {
      sum -= row[static_cast<size_t>(z)];
      row[static_cast<size_t>(z)] = 0.0;
    }
    for (size_t v = 0; v < kVocab; ++v) probs[node * kVocab + v] = static_cast<float>(row[v] / sum);
  }
  const auto row_of = [&](size_t node) { return std::span<const float>(probs).subspan(node * kVocab, kVocab); };

  std::vector<int64_t> first(kVocab, 0);
  std::vector<int64_t> after_node1(kVocab, 0);   // second token when the first is 2 (node 1)
  std::vector<int64_t> after_node3(kVocab, 0);   // second token when the first is 0 (node 3, a leaf)
  std::vector<int64_t> after_node4(kVocab, 0);   // third token when the first two are 2, 1 (node 4)
  const int kTrials = 200000;
  for (int trial = 0; trial < kTrials; ++trial) {
    const VerifyResult r = verify_sampling(tree, probs, kVocab, uniform);
    ASSERT_EQ(r.accepted_nodes.size(), r.accepted_tokens.size() + 1);
    Ints emitted = r.accepted_tokens;
    emitted.push_back(r.bonus_token);
    ++first[static_cast<size_t>(emitted[0])];
    if (emitted[0] == 2) ++after_node1[static_cast<size_t>(emitted[1])];
    if (emitted[0] == 0) ++after_node3[static_cast<size_t>(emitted[1])];
    if (emitted.size() >= 3 && emitted[0] == 2 && emitted[1] == 1) ++after_node4[static_cast<size_t>(emitted[2])];
    // Emitting a draft token means accepting its node: a rejected token is out of the residual.
    if (emitted[0] == 2) {
      ASSERT_EQ(r.accepted_nodes[1], 1);
    }
    if (emitted[0] == 0) {
      ASSERT_EQ(r.accepted_nodes[1], 3);
    }
  }
  expect_distribution(first, row_of(0), "first token vs the root row");
  expect_distribution(after_node1, row_of(1), "second token after 2 vs node 1's row");
  expect_distribution(after_node3, row_of(3), "second token after 0 vs node 3's row");
  expect_distribution(after_node4, row_of(4), "third token after 2, 1 vs node 4's row");
}

TEST(VerifySampling, OneHotTargetsAgreeWithGreedy) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const DraftTree tree = greedy_tree();
  constexpr int kVocab = 40;
  const Ints draft_tokens{11, 12, 21, 23, 33};
  for (int trial = 0; trial < 1000; ++trial) {
    Ints argmax(6);
    for (int32_t& a : argmax) {
      a = rng() % 2 == 0 ? draft_tokens[rng() % draft_tokens.size()] : static_cast<int32_t>(rng() % kVocab);
    }
    std::vector<float> probs(6 * kVocab, 0.0f);
    for (size_t i = 0; i < 6; ++i) probs[i * kVocab + static_cast<size_t>(argmax[i])] = 1.0f;
    const VerifyResult greedy = verify_greedy(tree, argmax);
    const VerifyResult sampled =
        verify_sampling(tree, probs, kVocab, [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; });
    EXPECT_EQ(sampled.accepted_nodes, greedy.accepted_nodes) << "trial " << trial;
    EXPECT_EQ(sampled.accepted_tokens, greedy.accepted_tokens) << "trial " << trial;
    EXPECT_EQ(sampled.bonus_token, greedy.bonus_token) << "trial " << trial;
  }
}

TEST(VerifyErrors, BadSizesAndValuesAreNamed) {
  const DraftTree tree = greedy_tree();
  EXPECT_THROW(verify_greedy(tree, Ints{11, 21, 23, 33, 12}), Error);
  EXPECT_THROW(verify_greedy(tree, Ints{}), Error);
  try {
    verify_greedy(tree, Ints(7, 0));
    ADD_FAILURE() << "no error for 7 argmax tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("7"), std::string::npos) << e.what();
  }

  const auto half = [] { return 0.5; };
  constexpr int kVocab = 40;
  std::vector<float> probs(6 * kVocab, 1.0f / kVocab);
  EXPECT_NO_THROW(verify_sampling(tree, probs, kVocab, half));
  try {
    verify_sampling(tree, std::span<const float>(probs).first(239), kVocab, half);
    ADD_FAILURE() << "no error for 239 probabilities";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("239"), std::string::npos) << e.what();
  }
  EXPECT_THROW(verify_sampling(tree, probs, 0, half), Error);
  EXPECT_THROW(verify_sampling(tree, std::span<const float>(probs).first(6 * 30), 30, half), Error);  // token 33
  EXPECT_THROW(verify_sampling(tree, probs, kVocab, [] { return 1.0; }), Error);
  EXPECT_THROW(verify_sampling(tree, probs, kVocab, [] { return -0.25; }), Error);
  EXPECT_THROW(verify_sampling(tree, probs, kVocab, std::function<double()>{}), Error);

  std::vector<float> negative = probs;
  negative[3] = -0.1f;
  EXPECT_THROW(verify_sampling(tree, negative, kVocab, half), Error);
  std::vector<float> empty_root = probs;
  std::fill_n(empty_root.begin(), kVocab, 0.0f);
  EXPECT_THROW(verify_sampling(tree, empty_root, kVocab, half), Error);
  std::vector<float> nan_row = probs;
  nan_row[5] = std::nanf("");
  EXPECT_THROW(verify_sampling(tree, nan_row, kVocab, half), Error);

  // Retrieve arrays that point backwards (or are missing) would make the walk loop or read out
  // of range.
  DraftTree loop = tree;
  loop.retrieve_next_sibling[1] = 1;
  EXPECT_THROW(verify_greedy(loop, Ints{12, 0, 0, 0, 0, 0}), Error);
  DraftTree out_of_range = tree;
  out_of_range.retrieve_next_token[4] = 6;
  EXPECT_THROW(verify_greedy(out_of_range, Ints(6, 0)), Error);
  DraftTree missing = tree;
  missing.retrieve_next_token.pop_back();
  EXPECT_THROW(verify_sampling(missing, probs, kVocab, half), Error);
  EXPECT_THROW(verify_greedy(DraftTree{}, Ints{}), Error);
}

}  // namespace
}  // namespace specula
