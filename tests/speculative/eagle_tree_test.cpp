// The EAGLE draft tree: a hand-worked tree with every layout spelled out, the tie rule, the topk=1
// chain, the SpecParams rules, random drafts checked against brute force, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/speculative/eagle_tree.h"
#include "speculative/spec_fixtures.h"

namespace specula {
namespace {

using Ints = std::vector<int32_t>;

using spec_fixtures::add_candidate;

// The draft of (num_steps 3, topk 2, num_draft_tokens 6), root token 7. Probabilities are dyadic so
// every score is exact in float.
//  step 0, root's top-2:        c0 tok 11 p .5    -> .5        c1 tok 12 p .375 -> .375
//  step 1, frontier [c0, c1]:   c0: c2 tok 21 p .5   -> .25     c3 tok 22 p .25   -> .125
//                               c1: c4 tok 23 p .75  -> .28125  c5 tok 24 p .125  -> .046875
//          best 2 children: c4 (.28125) then c2 (.25), so the next frontier is [c4, c2] in that
//          order, and step 2 numbers c4's children before c2's:
//  step 2, frontier [c4, c2]:   c4: c6 tok 31 p .5   -> .140625 c7 tok 32 p .25   -> .0703125
//                               c2: c8 tok 33 p .875 -> .21875  c9 tok 34 p .0625 -> .015625
// The 5 best of all 10: c0 .5, c1 .375, c4 .28125, c2 .25, c8 .21875 (next would be c6 .140625).
// In candidate order they are nodes 1..5: c0, c1, c2, c4, c8. Tree:
//   0 (7) ─┬─ 1 (11, c0) ── 3 (21, c2) ── 5 (33, c8)
//          └─ 2 (12, c1) ── 4 (23, c4)
DraftCandidates hand_worked_candidates() {
  DraftCandidates c;
  add_candidate(c, 11, -1, 0.5f);
  add_candidate(c, 12, -1, 0.375f);
  add_candidate(c, 21, 0, 0.25f);
  add_candidate(c, 22, 0, 0.125f);
  add_candidate(c, 23, 1, 0.28125f);
  add_candidate(c, 24, 1, 0.046875f);
  add_candidate(c, 31, 4, 0.140625f);
  add_candidate(c, 32, 4, 0.0703125f);
  add_candidate(c, 33, 2, 0.21875f);
  add_candidate(c, 34, 2, 0.015625f);
  return c;
}

TEST(EagleTree, HandWorkedTree) {
  const SpecParams params{3, 2, 6};
  EXPECT_NO_THROW(params.validate());
  const DraftTree tree = build_tree(7, hand_worked_candidates(), params.num_draft_tokens);
  ASSERT_EQ(tree.size(), 6);
  EXPECT_EQ(tree.tokens, (Ints{7, 11, 12, 21, 23, 33}));
  EXPECT_EQ(tree.candidate, (Ints{-1, 0, 1, 2, 4, 8}));
  EXPECT_EQ(tree.parents, (Ints{-1, 0, 0, 1, 2, 3}));
  EXPECT_EQ(tree.depths, (Ints{0, 1, 1, 2, 2, 3}));
  EXPECT_EQ(tree_positions(tree, 10), (Ints{10, 11, 11, 12, 12, 13}));
  EXPECT_EQ(tree.retrieve_next_token, (Ints{1, 3, 4, 5, -1, -1}));
  EXPECT_EQ(tree.retrieve_next_sibling, (Ints{-1, 2, -1, -1, -1, -1}));

  const std::vector<uint8_t> tree_part{
      1, 0, 0, 0, 0, 0,  //
      1, 1, 0, 0, 0, 0,  //
      1, 0, 1, 0, 0, 0,  //
      1, 1, 0, 1, 0, 0,  //
      1, 0, 1, 0, 1, 0,  //
      1, 1, 0, 1, 0, 1,  //
  };
  EXPECT_EQ(tree_mask_qlen_only(tree), tree_part);

  // Full mask for seq_len 3: three committed columns of ones, then the tree part.
  const std::vector<uint8_t> full{
      1, 1, 1, 1, 0, 0, 0, 0, 0,  //
      1, 1, 1, 1, 1, 0, 0, 0, 0,  //
      1, 1, 1, 1, 0, 1, 0, 0, 0,  //
      1, 1, 1, 1, 1, 0, 1, 0, 0,  //
      1, 1, 1, 1, 0, 1, 0, 1, 0,  //
      1, 1, 1, 1, 1, 0, 1, 0, 1,  //
  };
  std::vector<uint8_t> mask;
  append_tree_mask_full(tree, 3, mask);
  EXPECT_EQ(mask, full);
  // A second request is appended after the first, with its own seq_len (here 10).
  append_tree_mask_full(tree, 10, mask);
  ASSERT_EQ(mask.size(), full.size() + 6u * 16u);
  for (size_t i = 0; i < 6; ++i) {
    const auto row = mask.begin() + static_cast<std::ptrdiff_t>(full.size() + i * 16);
    EXPECT_TRUE(std::all_of(row, row + 10, [](uint8_t x) { return x == 1; })) << "row " << i;
    EXPECT_TRUE(std::equal(row + 10, row + 16, tree_part.begin() + static_cast<std::ptrdiff_t>(i * 6)))
        << "row " << i;
  }

  // Bits: row 3 sees nodes 0, 1, 3 -> 1 + 2 + 8.
  EXPECT_EQ(tree_mask_bitpacked(tree), (std::vector<uint32_t>{1, 3, 5, 11, 21, 43}));
  EXPECT_EQ(retrieve_index(3, 6), (Ints{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(retrieve_index(0, 6), Ints{});
}

TEST(EagleTree, TopKIndicesBreaksTiesToTheLowerIndex) {
  const std::vector<float> scores{1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
  EXPECT_EQ(top_k_indices(scores, 3), (Ints{1, 2, 4}));
  EXPECT_EQ(top_k_indices(scores, 4), (Ints{1, 2, 4, 3}));
  EXPECT_EQ(top_k_indices(scores, 10), (Ints{1, 2, 4, 3, 0}));
  EXPECT_EQ(top_k_indices(scores, 0), Ints{});
  EXPECT_EQ(top_k_indices({}, 3), Ints{});
}

TEST(EagleTree, TieRuleChoosesLowerCandidateAndKeepsParentsFirst) {
  // topk 2, num_steps 2. Children with probability 1 tie their parent's score; every tie is
  // broken by the candidate number, so the parent (lower number) always goes first.
  DraftCandidates c;
  add_candidate(c, 100, -1, 0.5f);  // c0
  add_candidate(c, 101, -1, 0.5f);  // c1
  add_candidate(c, 102, 0, 0.5f);   // c2, child of c0 with probability 1
  add_candidate(c, 103, 0, 0.0f);   // c3
  add_candidate(c, 104, 1, 0.5f);   // c4, child of c1 with probability 1
  add_candidate(c, 105, 1, 0.0f);   // c5

  const DraftTree three = build_tree(1, c, 4);  // c0, c1, c2 beat c4 on the tie
  EXPECT_EQ(three.candidate, (Ints{-1, 0, 1, 2}));
  EXPECT_EQ(three.parents, (Ints{-1, 0, 0, 1}));
  EXPECT_EQ(three.tokens, (Ints{1, 100, 101, 102}));

  const DraftTree four = build_tree(1, c, 5);
  EXPECT_EQ(four.candidate, (Ints{-1, 0, 1, 2, 4}));
  EXPECT_EQ(four.parents, (Ints{-1, 0, 0, 1, 2}));
  EXPECT_EQ(four.retrieve_next_token, (Ints{1, 3, 4, -1, -1}));
  EXPECT_EQ(four.retrieve_next_sibling, (Ints{-1, 2, -1, -1, -1}));

  // Zero scores tie too: c3 (child of chosen c0) wins over c5.
  const DraftTree all_but_one = build_tree(1, c, 6);
  EXPECT_EQ(all_but_one.candidate, (Ints{-1, 0, 1, 2, 3, 4}));
  EXPECT_EQ(all_but_one.parents, (Ints{-1, 0, 0, 1, 1, 2}));
  EXPECT_EQ(all_but_one.retrieve_next_token, (Ints{1, 3, 5, -1, -1, -1}));
  EXPECT_EQ(all_but_one.retrieve_next_sibling, (Ints{-1, 2, -1, 4, -1, -1}));
}

TEST(EagleTree, TopK1IsAChain) {
  const SpecParams params{4, 1, 5};
  EXPECT_NO_THROW(params.validate());
  DraftCandidates c;
  const float probs[] = {0.75f, 0.5f, 0.25f, 0.5f};
  float score = 1.0f;
  for (int32_t step = 0; step < params.num_steps; ++step) {
    score *= probs[step];
    add_candidate(c, 40 + step, step - 1, score);
  }
  const DraftTree tree = build_tree(9, c, params.num_draft_tokens);
  EXPECT_EQ(tree.tokens, (Ints{9, 40, 41, 42, 43}));
  EXPECT_EQ(tree.parents, (Ints{-1, 0, 1, 2, 3}));
  EXPECT_EQ(tree.depths, (Ints{0, 1, 2, 3, 4}));
  EXPECT_EQ(tree.candidate, (Ints{-1, 0, 1, 2, 3}));
  EXPECT_EQ(tree.retrieve_next_token, (Ints{1, 2, 3, 4, -1}));
  EXPECT_EQ(tree.retrieve_next_sibling, (Ints{-1, -1, -1, -1, -1}));
  EXPECT_EQ(tree_positions(tree, 0), (Ints{0, 1, 2, 3, 4}));
  // A chain is causal: lower triangle.
  EXPECT_EQ(tree_mask_qlen_only(tree), (std::vector<uint8_t>{
                                           1, 0, 0, 0, 0,  //
                                           1, 1, 0, 0, 0,  //
                                           1, 1, 1, 0, 0,  //
                                           1, 1, 1, 1, 0,  //
                                           1, 1, 1, 1, 1,  //
                                       }));
  EXPECT_EQ(tree_mask_bitpacked(tree), (std::vector<uint32_t>{1, 3, 7, 15, 31}));
}

TEST(EagleTree, ChainCandidatesBuildTheChainInOrder) {
  const Ints tokens = {40, 7, 40, 250};
  const DraftCandidates c = chain_candidates(tokens);
  EXPECT_EQ(c.parents, (Ints{-1, 0, 1, 2}));
  EXPECT_EQ(c.depths, (Ints{1, 2, 3, 4}));
  const DraftTree tree = build_tree(9, c, 5);
  EXPECT_EQ(tree.tokens, (Ints{9, 40, 7, 40, 250}));
  EXPECT_EQ(tree.parents, (Ints{-1, 0, 1, 2, 3}));
  EXPECT_EQ(tree.candidate, (Ints{-1, 0, 1, 2, 3}));
  EXPECT_EQ(tree.retrieve_next_token, (Ints{1, 2, 3, 4, -1}));
}

TEST(EagleTree, BitpackedMaskSpansSeveralWords) {
  // A 40-node chain: rows take two words; row i sets bits 0..i.
  DraftCandidates c;
  for (int32_t i = 0; i < 39; ++i) add_candidate(c, i, i - 1, 1.0f);
  const DraftTree tree = build_tree(0, c, 40);
  const std::vector<uint32_t> packed = tree_mask_bitpacked(tree);
  ASSERT_EQ(packed.size(), 80u);
  EXPECT_EQ(packed[0], 1u);
  EXPECT_EQ(packed[1], 0u);
  EXPECT_EQ(packed[31 * 2], 0xFFFFFFFFu);
  EXPECT_EQ(packed[31 * 2 + 1], 0u);
  EXPECT_EQ(packed[32 * 2], 0xFFFFFFFFu);
  EXPECT_EQ(packed[32 * 2 + 1], 1u);
  EXPECT_EQ(packed[39 * 2], 0xFFFFFFFFu);
  EXPECT_EQ(packed[39 * 2 + 1], 0xFFu);
}

void expect_invalid(const SpecParams& params, const std::vector<std::string>& fragments) {
  try {
    params.validate();
    ADD_FAILURE() << "no error for num_steps " << params.num_steps << ", topk " << params.topk
                  << ", num_draft_tokens " << params.num_draft_tokens;
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "message: " << message << "; missing: " << fragment;
    }
  }
}

TEST(SpecParams, AcceptsValidCombinations) {
  for (const SpecParams& p : {SpecParams{1, 1, 2}, SpecParams{4, 1, 5}, SpecParams{3, 2, 2}, SpecParams{3, 2, 6},
                              SpecParams{3, 2, 11}, SpecParams{1, 4, 5}, SpecParams{5, 8, 64}, SpecParams{5, 8, 256},
                              SpecParams{32, 1, 33}, SpecParams{32, 16, 256}}) {
    EXPECT_NO_THROW(p.validate()) << p.num_steps << " " << p.topk << " " << p.num_draft_tokens;
  }
  EXPECT_EQ((SpecParams{7, 1, 8}.scratch_tokens()), 8);
  EXPECT_EQ((SpecParams{32, 16, 256}.scratch_tokens()), 31 * 16);
}

TEST(SpecParams, RejectsInvalidCombinationsNamingTheFlagAndValue) {
  EXPECT_THROW((SpecParams{0, 2, 4}.validate()), Error);
  expect_invalid({0, 2, 4}, {"--speculative-num-steps 0", "[1, 32]"});
  expect_invalid({-3, 2, 4}, {"--speculative-num-steps -3"});
  expect_invalid({2000, 1, 2001}, {"--speculative-num-steps 2000", "[1, 32]"});
  expect_invalid({3, 0, 4}, {"--speculative-eagle-topk 0", "[1, 16]"});
  expect_invalid({3, 170, 4}, {"--speculative-eagle-topk 170", "[1, 16]"});
  expect_invalid({3, 2, 12}, {"--speculative-num-draft-tokens 12", "--speculative-num-steps 3",
                              "--speculative-eagle-topk 2", "[2, 11]"});
  expect_invalid({3, 2, 40}, {"--speculative-num-draft-tokens 40", "[2, 11]"});
  expect_invalid({3, 2, 1}, {"--speculative-num-draft-tokens 1", "[2, 11]"});
  expect_invalid({1, 4, 6}, {"--speculative-num-draft-tokens 6", "[2, 5]"});
  expect_invalid({4, 1, 4}, {"--speculative-num-draft-tokens 4", "topk 1", "must be 5"});
  expect_invalid({4, 1, 6}, {"--speculative-num-draft-tokens 6", "must be 5"});
  // The tree bound is capped at kMaxDraftTokens (1 + 16 + 31 * 256 would allow 7953).
  expect_invalid({32, 16, 257}, {"--speculative-num-draft-tokens 257", "[2, 256]"});
}

// A draft of (num_steps, topk) as the drafting loop makes it. Probabilities are multiples of 1/8
// (0 included), so scores are exact and ties are frequent.
DraftCandidates simulate_draft(int num_steps, int topk, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> eighths(0, 8);
  std::uniform_int_distribution<int32_t> token(0, 999);
  const auto child_probs = [&] {
    std::vector<float> p(static_cast<size_t>(topk));
    for (float& x : p) x = static_cast<float>(eighths(rng)) / 8.0f;
    std::sort(p.begin(), p.end(), std::greater<>());
    return p;
  };
  DraftCandidates c;
  Ints frontier;
  for (float p : child_probs()) {
    frontier.push_back(static_cast<int32_t>(c.tokens.size()));
    add_candidate(c, token(rng), -1, p);
  }
  for (int step = 1; step < num_steps; ++step) {
    Ints children;
    for (int32_t parent : frontier) {
      for (float p : child_probs()) {
        children.push_back(static_cast<int32_t>(c.tokens.size()));
        add_candidate(c, token(rng), parent, c.scores[static_cast<size_t>(parent)] * p);
      }
    }
    // Stable: children are in candidate order, so equal scores keep the lower number first.
    std::stable_sort(children.begin(), children.end(), [&](int32_t a, int32_t b) {
      return c.scores[static_cast<size_t>(a)] > c.scores[static_cast<size_t>(b)];
    });
    frontier.assign(children.begin(), children.begin() + topk);
  }
  return c;
}

TEST(EagleTree, RandomDraftsMatchBruteForce) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    const int num_steps = std::uniform_int_distribution<int>(1, 6)(rng);
    const int topk = std::uniform_int_distribution<int>(1, 5)(rng);
    const int max_draft = 1 + topk + (num_steps - 1) * topk * topk;
    const int num_draft = topk == 1 ? num_steps + 1 : std::uniform_int_distribution<int>(2, max_draft)(rng);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": num_steps " + std::to_string(num_steps) + ", topk " +
                 std::to_string(topk) + ", num_draft_tokens " + std::to_string(num_draft));
    ASSERT_NO_THROW((SpecParams{num_steps, topk, num_draft}.validate()));
    const DraftCandidates c = simulate_draft(num_steps, topk, rng);
    ASSERT_EQ(static_cast<int>(c.tokens.size()), max_draft - 1);
    const int32_t root = 5000 + trial;
    const DraftTree tree = build_tree(root, c, num_draft);
    const size_t n = static_cast<size_t>(num_draft);
    ASSERT_EQ(tree.tokens.size(), n);
    ASSERT_EQ(tree.parents.size(), n);
    ASSERT_EQ(tree.depths.size(), n);
    ASSERT_EQ(tree.candidate.size(), n);
    ASSERT_EQ(tree.retrieve_next_token.size(), n);
    ASSERT_EQ(tree.retrieve_next_sibling.size(), n);
    EXPECT_EQ(tree.tokens[0], root);
    EXPECT_EQ(tree.parents[0], -1);
    EXPECT_EQ(tree.depths[0], 0);
    EXPECT_EQ(tree.candidate[0], -1);

    // Brute force: candidate d is chosen iff fewer than n - 1 candidates beat it.
    const size_t m = c.tokens.size();
    Ints expected_chosen;
    for (size_t d = 0; d < m; ++d) {
      size_t better = 0;
      for (size_t e = 0; e < m; ++e) {
        better += c.scores[e] > c.scores[d] || (c.scores[e] == c.scores[d] && e < d);
      }
      if (better < n - 1) expected_chosen.push_back(static_cast<int32_t>(d));
    }
    EXPECT_EQ(Ints(tree.candidate.begin() + 1, tree.candidate.end()), expected_chosen);

    for (size_t i = 1; i < n; ++i) {
      const int32_t parent = tree.parents[i];
      ASSERT_GE(parent, 0);
      ASSERT_LT(parent, static_cast<int32_t>(i));
      const size_t cand = static_cast<size_t>(tree.candidate[i]);
      EXPECT_EQ(tree.depths[i], tree.depths[static_cast<size_t>(parent)] + 1) << "node " << i;
      EXPECT_EQ(tree.depths[i], c.depths[cand]) << "node " << i;
      EXPECT_EQ(tree.tokens[i], c.tokens[cand]) << "node " << i;
      EXPECT_EQ(c.parents[cand], parent == 0 ? -1 : tree.candidate[static_cast<size_t>(parent)]) << "node " << i;
    }

    // Retrieve arrays: lowest child, next higher sibling.
    for (size_t i = 0; i < n; ++i) {
      int32_t first_child = -1;
      int32_t next_sibling = -1;
      for (size_t j = n; j-- > 1;) {
        if (tree.parents[j] == static_cast<int32_t>(i)) first_child = static_cast<int32_t>(j);
        if (i > 0 && j > i && tree.parents[j] == tree.parents[i]) next_sibling = static_cast<int32_t>(j);
      }
      EXPECT_EQ(tree.retrieve_next_token[i], first_child) << "node " << i;
      EXPECT_EQ(tree.retrieve_next_sibling[i], next_sibling) << "node " << i;
    }

    // Masks against ancestor walks.
    const int32_t seq_len = std::uniform_int_distribution<int32_t>(0, 20)(rng);
    const std::vector<uint8_t> qlen = tree_mask_qlen_only(tree);
    const std::vector<uint32_t> packed = tree_mask_bitpacked(tree);
    std::vector<uint8_t> full{42};  // appended after existing content
    append_tree_mask_full(tree, seq_len, full);
    const size_t words = (n + 31) / 32;
    const size_t width = static_cast<size_t>(seq_len) + n;
    ASSERT_EQ(qlen.size(), n * n);
    ASSERT_EQ(packed.size(), n * words);
    ASSERT_EQ(full.size(), 1 + n * width);
    EXPECT_EQ(full[0], 42);
    const Ints positions = tree_positions(tree, seq_len);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(positions[i], seq_len + tree.depths[i]);
      std::vector<uint8_t> on_path(n, 0);
      for (int32_t a = static_cast<int32_t>(i); a != -1; a = tree.parents[static_cast<size_t>(a)]) {
        on_path[static_cast<size_t>(a)] = 1;
      }
      for (size_t j = 0; j < static_cast<size_t>(seq_len); ++j) EXPECT_EQ(full[1 + i * width + j], 1);
      for (size_t j = 0; j < n; ++j) {
        EXPECT_EQ(qlen[i * n + j], on_path[j]) << "row " << i << " col " << j;
        EXPECT_EQ(full[1 + i * width + static_cast<size_t>(seq_len) + j], on_path[j]) << "row " << i << " col " << j;
        EXPECT_EQ((packed[i * words + j / 32] >> (j % 32)) & 1u, on_path[j]) << "row " << i << " col " << j;
      }
      for (size_t j = n; j < words * 32; ++j) EXPECT_EQ((packed[i * words + j / 32] >> (j % 32)) & 1u, 0u);
    }
  }
}

TEST(EagleTree, TopKIndicesMatchesBruteForce) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t size = std::uniform_int_distribution<size_t>(0, 40)(rng);
    std::vector<float> scores(size);
    for (float& s : scores) s = static_cast<float>(std::uniform_int_distribution<int>(0, 6)(rng)) * 0.25f;
    const int k = std::uniform_int_distribution<int>(0, 45)(rng);
    Ints expected;
    std::vector<bool> used(size, false);
    for (int r = 0; r < k && static_cast<size_t>(r) < size; ++r) {
      int32_t best = -1;
      for (size_t i = 0; i < size; ++i) {
        if (!used[i] && (best < 0 || scores[i] > scores[static_cast<size_t>(best)])) best = static_cast<int32_t>(i);
      }
      used[static_cast<size_t>(best)] = true;
      expected.push_back(best);
    }
    EXPECT_EQ(top_k_indices(scores, k), expected) << "trial " << trial;
  }
}

TEST(EagleTree, BadInputIsNamed) {
  const DraftCandidates good = hand_worked_candidates();
  EXPECT_THROW(build_tree(7, good, 12), Error);  // 10 candidates cannot fill 11 nodes
  try {
    build_tree(7, good, 12);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_draft_tokens 12"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(build_tree(7, good, 11));

  DraftCandidates short_scores = good;
  short_scores.scores.pop_back();
  EXPECT_THROW(build_tree(7, short_scores, 6), Error);

  DraftCandidates forward_parent = good;
  forward_parent.parents[2] = 5;  // parents must precede children
  EXPECT_THROW(build_tree(7, forward_parent, 6), Error);

  DraftCandidates wrong_depth = good;
  wrong_depth.depths[8] = 2;
  EXPECT_THROW(build_tree(7, wrong_depth, 6), Error);

  DraftCandidates growing = good;
  growing.scores[8] = 0.9f;  // a child scored above its unchosen parent's path
  growing.scores[2] = 0.01f;
  try {
    build_tree(7, growing, 3);
    ADD_FAILURE() << "no error for a chosen child without its parent";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parent candidate 2"), std::string::npos) << e.what();
  }

  EXPECT_THROW(top_k_indices(std::vector<float>{1.0f}, -1), Error);
  EXPECT_THROW(retrieve_index(-1, 4), Error);
  EXPECT_THROW(retrieve_index(2, 0), Error);

  DraftTree tree = build_tree(7, good, 6);
  EXPECT_THROW(tree_positions(tree, -1), Error);
  std::vector<uint8_t> mask;
  EXPECT_THROW(append_tree_mask_full(tree, -1, mask), Error);
  tree.parents[3] = 4;  // a parent after its child
  EXPECT_THROW(tree_mask_qlen_only(tree), Error);
  EXPECT_THROW(tree_mask_bitpacked(tree), Error);
  EXPECT_THROW(append_tree_mask_full(tree, 2, mask), Error);
  EXPECT_TRUE(mask.empty());
}

}  // namespace
}  // namespace specula
