// The EAGLE tree-draft GPU kernels against host references: draft_top_k against
// CpuDraftHead::top_k's softmax and BetterScore order, draft_init + draft_select against a
// re-implementation of CpuDraftHead::draft's bookkeeping (bit-identical candidates), and
// all of them with the draft head's tree_attention captured in a CUDA graph (replays equal the
// eager run bit for bit). Random inputs; the seed is printed and can be
// fixed with SPECULA_TEST_SEED. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "specula/attention/cuda/kernels/tree_attention.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device.h"
#include "specula/speculative/cuda/draft_kernels.h"
#include "specula/speculative/eagle_tree.h"
#include "specula/speculative/verify.h"

namespace specula::testing {
namespace {

namespace ck = cuda_kernels;

constexpr const char* kBinary = "cuda_draft_kernels_test";

// BetterScore's order: higher first, equal values to the lower index.
std::vector<int32_t> better_order(const std::vector<float>& scores, int k) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

// ---- draft_top_k ------------------------------------------------------------------------

struct TopKCase {
  int64_t rows;
  int vocab;
  int k;
  bool d2t;
  bool ties;  // logits on a coarse grid (many exact ties, also at the top), row 0 constant
};

TEST(CudaDraftKernels, TopKMatchesHostSoftmaxAndTieOrder) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary));
  const std::vector<TopKCase> cases = {
      {5, 259, 1, false, false},  {7, 259, 4, true, true},     {9, 259, 16, false, true},   {3, 100, 3, false, true},
      {33, 1000, 5, true, false}, {4, 32000, 8, true, false},  {6, 32000, 16, false, true}, {5, 32000, 4, true, true},
      {3, 32000, 1, false, true}, {2, 128256, 8, false, false}, {2, 128256, 16, true, true},
  };
  for (const TopKCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " vocab " << c.vocab << " k " << c.k << " d2t " << c.d2t
                                      << " ties " << c.ties);
    const size_t V = static_cast<size_t>(c.vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(static_cast<size_t>(c.rows) * V);
    for (size_t r = 0; r < static_cast<size_t>(c.rows); ++r) {
      for (size_t i = 0; i < V; ++i) {
        float x = normal(rng);
        if (c.ties) x = r == 0 ? 1.25f : std::round(x * 2.0f) / 2.0f;
        logits[r * V + i] = x;
      }
    }
    std::vector<int64_t> d2t(V);
    std::uniform_int_distribution<int64_t> offset(0, 200000);
    for (int64_t& d : d2t) d = offset(rng);

    DeviceArray<float> d_logits(logits);
    DeviceArray<int64_t> d_d2t(d2t);
    DeviceArray<int32_t> d_tokens(static_cast<size_t>(c.rows * c.k));
    DeviceArray<float> d_probs(static_cast<size_t>(c.rows * c.k));
    ck::DraftTopKParams p{};
    p.logits = d_logits.get();
    p.rows = c.rows;
    p.vocab = c.vocab;
    p.k = c.k;
    p.d2t = c.d2t ? d_d2t.get() : nullptr;
    p.tokens = d_tokens.get();
    p.probs = d_probs.get();
    ck::draft_top_k(p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> tokens = d_tokens.download();
    const std::vector<float> probs = d_probs.download();

    for (size_t r = 0; r < static_cast<size_t>(c.rows); ++r) {
      // CpuDraftHead::top_k: float exp, double sum, float probabilities ranked by BetterScore.
      const float* l = logits.data() + r * V;
      const float top = *std::max_element(l, l + V);
      std::vector<float> pf(V);
      double sum = 0;
      for (size_t i = 0; i < V; ++i) sum += pf[i] = std::exp(l[i] - top);
      for (float& x : pf) x = static_cast<float>(x / sum);
      double sum64 = 0;  // the float64 softmax the probabilities are checked against
      for (size_t i = 0; i < V; ++i) sum64 += std::exp(static_cast<double>(l[i]) - top);
      const std::vector<int32_t> best = better_order(pf, c.k);
      for (int t = 0; t < c.k; ++t) {
        const size_t o = r * static_cast<size_t>(c.k) + static_cast<size_t>(t);
        const int32_t id = best[static_cast<size_t>(t)];
        const int64_t expect = c.d2t ? id + d2t[static_cast<size_t>(id)] : id;
        ASSERT_EQ(tokens[o], expect) << "row " << r << " rank " << t;
        const double p64 = std::exp(static_cast<double>(l[id]) - top) / sum64;
        EXPECT_NEAR(probs[o], p64, 1e-5 * p64) << "row " << r << " rank " << t;
      }
    }
  }
}

// ---- draft_init + draft_select ----------------------------------------------------------

struct TreeCase {
  int batch, k, num_steps, hidden;
  bool ties;  // probabilities from {1/8, 1/4, 1/2, 3/4}: exact products, many equal scores
};

// CpuDraftHead::draft's bookkeeping on the host, with the per-row top-k results given.
struct HostTree {
  int batch, k, num_steps, hidden;
  std::vector<std::vector<int32_t>> tokens, parents;
  std::vector<std::vector<float>> scores;
  std::vector<std::vector<int32_t>> frontier;  // [batch][k] candidate index
  std::vector<std::vector<int32_t>> slot_of;   // [batch][candidate] KV slot, -1 when not expanded
  std::vector<float> frontier_hidden;          // [rows, hidden]
  std::vector<int32_t> step_slots;             // [num_steps - 1, batch, k]

  int32_t own_slot(int step, int b, int j) const {
    return step_slots[(static_cast<size_t>(step - 1) * batch + b) * k + j];
  }

  // The row's branch as the next step (step) will see it: the node's ancestors below the
  // root (root side first), then its own slot when that step exists.
  std::vector<int32_t> branch(int b, int j, int step) const {
    std::vector<int32_t> out;
    const int32_t f = frontier[b][j];
    for (int32_t a = parents[b][f]; a >= 0; a = parents[b][a]) out.push_back(slot_of[b][a]);
    std::reverse(out.begin(), out.end());
    if (step <= num_steps - 1) out.push_back(own_slot(step, b, j));
    return out;
  }
};

// The device arrays of a DraftTreeState for batch x k rows (uninitialised but step_slots).
struct DraftTreeArrays {
  DraftTreeArrays(int batch, int k, int num_steps, int hidden, const std::vector<int32_t>& slots)
      : batch(batch),
        k(k),
        num_steps(num_steps),
        hidden(hidden),
        rows(static_cast<size_t>(batch) * k),
        candidates(static_cast<size_t>(batch) * ck::draft_num_candidates(k, num_steps)),
        frontier_scores(rows),
        row_hidden(rows * hidden),
        cand_scores(candidates),
        frontier_nodes(rows),
        row_tokens(rows),
        branch(rows * num_steps),
        step_slots(slots),
        cand_tokens(candidates),
        cand_parents(candidates) {}

  ck::DraftTreeState state() const {
    return {batch, k, num_steps, hidden, frontier_scores.get(), frontier_nodes.get(), row_tokens.get(),
            row_hidden.get(), branch.get(), step_slots.get(), cand_tokens.get(), cand_parents.get(), cand_scores.get()};
  }

  int batch, k, num_steps, hidden;
  size_t rows, candidates;  // batch * k; batch * draft_num_candidates
  DeviceArray<float> frontier_scores, row_hidden, cand_scores;
  DeviceArray<int32_t> frontier_nodes, row_tokens, branch, step_slots, cand_tokens, cand_parents;
};

void expect_state(const HostTree& h, const ck::DraftTreeState& st, int next_step, const std::string& when) {
  SCOPED_TRACE(when);
  const size_t rows = static_cast<size_t>(h.batch * h.k);
  std::vector<float> scores(rows), hidden(rows * h.hidden);
  std::vector<int32_t> nodes(rows), tokens(rows), branch(rows * h.num_steps);
  CUDA_CHECK(cudaMemcpy(scores.data(), st.frontier_scores, rows * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(nodes.data(), st.frontier_nodes, rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(tokens.data(), st.row_tokens, rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(hidden.data(), st.row_hidden, hidden.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(branch.data(), st.branch, branch.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (int b = 0; b < h.batch; ++b) {
    for (int j = 0; j < h.k; ++j) {
      const size_t r = static_cast<size_t>(b * h.k + j);
      const int32_t f = h.frontier[b][j];
      ASSERT_EQ(nodes[r], f) << "row " << r;
      ASSERT_EQ(std::bit_cast<uint32_t>(scores[r]), std::bit_cast<uint32_t>(h.scores[b][f])) << "row " << r;
      ASSERT_EQ(tokens[r], h.tokens[b][f]) << "row " << r;
      const std::vector<int32_t> expect = h.branch(b, j, next_step);
      for (size_t i = 0; i < expect.size(); ++i) {
        ASSERT_EQ(branch[r * h.num_steps + i], expect[i]) << "row " << r << " branch entry " << i;
      }
      ASSERT_EQ(0, std::memcmp(hidden.data() + r * h.hidden, h.frontier_hidden.data() + r * h.hidden,
                               static_cast<size_t>(h.hidden) * sizeof(float)))
          << "row " << r << " hidden";
    }
  }
}

TEST(CudaDraftKernels, TreeExpansionMatchesDraftStepsBookkeeping) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary) + 1);
  const std::vector<TreeCase> cases = {
      {1, 1, 2, 64, false}, {3, 4, 5, 96, true},  {2, 8, 6, 256, false}, {4, 16, 4, 130, true},
      {5, 3, 3, 8, true},   {2, 16, 7, 64, false}, {3, 4, 1, 32, false},  {6, 2, 8, 4096, true},
  };
  std::uniform_real_distribution<float> uniform(0.01f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token_dist(0, 150000);
  const float grid[] = {0.125f, 0.25f, 0.5f, 0.75f};
  for (const TreeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "batch " << c.batch << " topk " << c.k << " num_steps " << c.num_steps
                                      << " hidden " << c.hidden << " ties " << c.ties);
    auto prob = [&] { return c.ties ? grid[rng() % 4] : uniform(rng); };
    const int B = c.batch, K = c.k, S = c.num_steps, H = c.hidden;
    const size_t rows = static_cast<size_t>(B * K);
    const int nc = ck::draft_num_candidates(K, S);

    HostTree h{B, K, S, H, {}, {}, {}, {}, {}, {}, {}};
    // Distinct KV slots for every (step, request, row).
    h.step_slots.resize(static_cast<size_t>(std::max(S - 1, 0)) * rows);
    std::iota(h.step_slots.begin(), h.step_slots.end(), 1000);
    std::shuffle(h.step_slots.begin(), h.step_slots.end(), rng);

    std::vector<int32_t> root_tokens(rows);
    std::vector<float> root_probs(rows), root_hidden(static_cast<size_t>(B) * H);
    for (auto& t : root_tokens) t = token_dist(rng);
    for (auto& p : root_probs) p = prob();
    for (auto& x : root_hidden) x = normal(rng);

    h.tokens.assign(B, {});
    h.parents.assign(B, {});
    h.scores.assign(B, {});
    h.frontier.assign(B, {});
    h.slot_of.assign(B, {});
    h.frontier_hidden.resize(rows * H);
    for (int b = 0; b < B; ++b) {
      for (int j = 0; j < K; ++j) {
        h.tokens[b].push_back(root_tokens[b * K + j]);
        h.parents[b].push_back(-1);
        h.scores[b].push_back(root_probs[b * K + j]);
        h.frontier[b].push_back(j);
        std::copy_n(root_hidden.begin() + static_cast<ptrdiff_t>(b) * H, H,
                    h.frontier_hidden.begin() + static_cast<ptrdiff_t>(b * K + j) * H);
      }
    }

    DraftTreeArrays tree(B, K, S, H, h.step_slots);
    for (DeviceArray<int32_t>* a : {&tree.frontier_nodes, &tree.row_tokens, &tree.branch, &tree.cand_tokens,
                                    &tree.cand_parents}) {
      a->fill_bytes(0xff);
    }
    DeviceArray<int32_t> d_root_tokens(root_tokens);
    DeviceArray<float> d_root_probs(root_probs), d_root_hidden(root_hidden);
    // The roots go through a store indexed by request (shuffled rows, more rows than requests,
    // filled with garbage first), as the draft extend leaves them for the next draft loop.
    const int store_rows = B + 3;
    std::vector<int32_t> rows_of(static_cast<size_t>(store_rows));
    std::iota(rows_of.begin(), rows_of.end(), 0);
    std::shuffle(rows_of.begin(), rows_of.end(), rng);
    rows_of.resize(static_cast<size_t>(B));
    DeviceArray<int32_t> d_rows(rows_of), store_tokens(static_cast<size_t>(store_rows) * K);
    DeviceArray<float> store_probs(static_cast<size_t>(store_rows) * K), store_hidden(static_cast<size_t>(store_rows) * H);
    store_tokens.fill_bytes(0x7f);
    store_probs.fill_bytes(0x7f);
    store_hidden.fill_bytes(0x7f);
    ck::draft_store_roots({store_hidden.get(), store_tokens.get(), store_probs.get(), H, K}, d_rows.get(), B,
                          d_root_hidden.get(), d_root_tokens.get(), d_root_probs.get(), nullptr);
    {
      // Request b's root sits in row rows_of[b]; the other rows keep their fill.
      const std::vector<int32_t> got_tokens = store_tokens.download();
      const std::vector<float> got_probs = store_probs.download(), got_hidden = store_hidden.download();
      std::vector<int> owner(static_cast<size_t>(store_rows), -1);
      for (int b = 0; b < B; ++b) owner[static_cast<size_t>(rows_of[static_cast<size_t>(b)])] = b;
      for (int row = 0; row < store_rows; ++row) {
        const int b = owner[static_cast<size_t>(row)];
        for (int j = 0; j < K; ++j) {
          const size_t at = static_cast<size_t>(row) * K + j;
          if (b < 0) {
            ASSERT_EQ(got_tokens[at], 0x7f7f7f7f) << "store row " << row;
            continue;
          }
          ASSERT_EQ(got_tokens[at], root_tokens[static_cast<size_t>(b) * K + j]) << "store row " << row;
          ASSERT_EQ(got_probs[at], root_probs[static_cast<size_t>(b) * K + j]) << "store row " << row;
        }
        for (int i = 0; b >= 0 && i < H; ++i) {
          ASSERT_EQ(got_hidden[static_cast<size_t>(row) * H + i], root_hidden[static_cast<size_t>(b) * H + i]);
        }
      }
    }
    const ck::DraftTreeState st = tree.state();
    ck::draft_init(st, store_tokens.get(), store_probs.get(), store_hidden.get(), d_rows.get(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    expect_state(h, st, 1, "after draft_init");

    for (int step = 1; step < S; ++step) {
      // The rows expanded at this step get their own slots (as draft_steps records them).
      for (int b = 0; b < B; ++b) {
        h.slot_of[b].resize(h.tokens[b].size(), -1);
        for (int j = 0; j < K; ++j) h.slot_of[b][h.frontier[b][j]] = h.own_slot(step, b, j);
      }
      std::vector<int32_t> child_tokens(rows * K);
      std::vector<float> child_probs(rows * K), step_hidden(rows * H);
      for (auto& t : child_tokens) t = token_dist(rng);
      for (size_t r = 0; r < rows; ++r) {
        for (int t = 0; t < K; ++t) child_probs[r * K + t] = prob();
        std::sort(child_probs.begin() + static_cast<ptrdiff_t>(r * K),
                  child_probs.begin() + static_cast<ptrdiff_t>((r + 1) * K), std::greater<>());
      }
      for (auto& x : step_hidden) x = normal(rng);

      for (int b = 0; b < B; ++b) {
        const size_t first_child = h.tokens[b].size();
        std::vector<int32_t> child_row;
        for (int j = 0; j < K; ++j) {
          const size_t r = static_cast<size_t>(b * K + j);
          const int32_t f = h.frontier[b][j];
          for (int t = 0; t < K; ++t) {
            h.tokens[b].push_back(child_tokens[r * K + t]);
            h.parents[b].push_back(f);
            h.scores[b].push_back(h.scores[b][f] * child_probs[r * K + t]);
            child_row.push_back(static_cast<int32_t>(r));
          }
        }
        const std::vector<float> child_scores(h.scores[b].begin() + static_cast<ptrdiff_t>(first_child),
                                              h.scores[b].end());
        const std::vector<int32_t> best = better_order(child_scores, K);
        for (int j = 0; j < K; ++j) {
          const int32_t local = best[static_cast<size_t>(j)];
          h.frontier[b][j] = static_cast<int32_t>(first_child) + local;
          std::copy_n(step_hidden.begin() + static_cast<ptrdiff_t>(child_row[local]) * H, H,
                      h.frontier_hidden.begin() + static_cast<ptrdiff_t>(b * K + j) * H);
        }
      }
      DeviceArray<int32_t> d_child_tokens(child_tokens);
      DeviceArray<float> d_child_probs(child_probs), d_step_hidden(step_hidden);
      ck::draft_select(st, step, d_child_tokens.get(), d_child_probs.get(), d_step_hidden.get(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      expect_state(h, st, step + 1, "after draft_select step " + std::to_string(step));
    }

    const std::vector<int32_t> tokens = tree.cand_tokens.download(), parents = tree.cand_parents.download();
    const std::vector<float> scores = tree.cand_scores.download();
    for (int b = 0; b < B; ++b) {
      ASSERT_EQ(h.tokens[b].size(), static_cast<size_t>(nc));
      for (int i = 0; i < nc; ++i) {
        const size_t o = static_cast<size_t>(b) * nc + i;
        ASSERT_EQ(tokens[o], h.tokens[b][i]) << "request " << b << " candidate " << i;
        ASSERT_EQ(parents[o], h.parents[b][i]) << "request " << b << " candidate " << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(scores[o]), std::bit_cast<uint32_t>(h.scores[b][i]))
            << "request " << b << " candidate " << i << ": " << scores[o] << " vs " << h.scores[b][i];
      }
    }
  }
}

// draft_top1_select against draft_top_k + draft_select for chains (topk 1): from the same roots,
// over the same per-step logits (vocabularies of 259, 4096 and 32000, with and without d2t,
// with exact ties), every array of the two states is equal bit for bit after every step.
TEST(CudaDraftKernels, Top1SelectEqualsTopKThenSelect) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary) + 2);
  struct Case {
    int batch, num_steps, hidden, vocab;
    bool d2t, ties;
  };
  const std::vector<Case> cases = {{1, 2, 64, 259, false, false},   {3, 7, 256, 259, true, true},
                                   {5, 4, 130, 4096, true, false},  {2, 6, 4096, 32000, false, true},
                                   {16, 8, 96, 1000, true, true}};
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> uniform(0.01f, 1.0f);
  std::uniform_int_distribution<int32_t> token_dist(0, 150000);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "batch " << c.batch << " num_steps " << c.num_steps << " hidden " << c.hidden
                                      << " vocab " << c.vocab << " d2t " << c.d2t << " ties " << c.ties);
    const int B = c.batch, S = c.num_steps, H = c.hidden, V = c.vocab;
    std::vector<int32_t> step_slots(static_cast<size_t>(S - 1) * B);
    std::iota(step_slots.begin(), step_slots.end(), 7000);
    std::shuffle(step_slots.begin(), step_slots.end(), rng);
    DraftTreeArrays two(B, 1, S, H, step_slots), fused(B, 1, S, H, step_slots);
    for (DraftTreeArrays* t : {&two, &fused}) {
      for (DeviceArray<int32_t>* a : {&t->frontier_nodes, &t->row_tokens, &t->branch, &t->cand_tokens, &t->cand_parents}) {
        a->fill_bytes(0xff);
      }
      t->cand_scores.fill_bytes(0xff);
    }
    std::vector<int32_t> root_tokens(static_cast<size_t>(B));
    std::vector<float> root_probs(static_cast<size_t>(B)), root_hidden(static_cast<size_t>(B) * H);
    for (auto& t : root_tokens) t = token_dist(rng);
    for (auto& p : root_probs) p = uniform(rng);
    for (auto& x : root_hidden) x = normal(rng);
    DeviceArray<int32_t> d_root_tokens(root_tokens);
    DeviceArray<float> d_root_probs(root_probs), d_root_hidden(root_hidden);
    std::vector<int64_t> d2t(static_cast<size_t>(V));
    std::uniform_int_distribution<int64_t> offset(0, 200000);
    for (int64_t& d : d2t) d = offset(rng);
    DeviceArray<int64_t> d_d2t(d2t);
    const int64_t* map = c.d2t ? d_d2t.get() : nullptr;
    const ck::DraftTreeState st2 = two.state(), stf = fused.state();
    ck::draft_init(st2, d_root_tokens.get(), d_root_probs.get(), d_root_hidden.get(), nullptr, nullptr);
    ck::draft_init(stf, d_root_tokens.get(), d_root_probs.get(), d_root_hidden.get(), nullptr, nullptr);
    DeviceArray<int32_t> child_tokens(static_cast<size_t>(B));
    DeviceArray<float> child_probs(static_cast<size_t>(B));
    for (int step = 1; step < S; ++step) {
      std::vector<float> logits(static_cast<size_t>(B) * V), step_hidden(static_cast<size_t>(B) * H);
      for (float& x : logits) x = c.ties ? std::round(normal(rng) * 2.0f) / 2.0f : normal(rng);
      for (float& x : step_hidden) x = normal(rng);
      DeviceArray<float> d_logits(logits), d_step_hidden(step_hidden);
      ck::DraftTopKParams p{};
      p.logits = d_logits.get();
      p.rows = B;
      p.vocab = V;
      p.k = 1;
      p.d2t = map;
      p.tokens = child_tokens.get();
      p.probs = child_probs.get();
      ck::draft_top_k(p, nullptr);
      ck::draft_select(st2, step, child_tokens.get(), child_probs.get(), d_step_hidden.get(), nullptr);
      ck::draft_top1_select(stf, step, d_logits.get(), V, map, d_step_hidden.get(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      SCOPED_TRACE(::testing::Message() << "after step " << step);
      auto same_bits = [](const auto& a, const auto& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
      };
      ASSERT_TRUE(same_bits(two.cand_tokens.download(), fused.cand_tokens.download()));
      ASSERT_TRUE(same_bits(two.cand_parents.download(), fused.cand_parents.download()));
      ASSERT_TRUE(same_bits(two.cand_scores.download(), fused.cand_scores.download()));
      ASSERT_TRUE(same_bits(two.frontier_scores.download(), fused.frontier_scores.download()));
      ASSERT_TRUE(same_bits(two.frontier_nodes.download(), fused.frontier_nodes.download()));
      ASSERT_TRUE(same_bits(two.row_tokens.download(), fused.row_tokens.download()));
      ASSERT_TRUE(same_bits(two.row_hidden.download(), fused.row_hidden.download()));
      // Entries past a row's path are never read; compare the path (steps so far, plus the next
      // step's own slot when one follows).
      const std::vector<int32_t> b2 = two.branch.download(), bf = fused.branch.download();
      const int len = std::min(step + 1, S - 1);
      for (int b = 0; b < B; ++b) {
        for (int d = 0; d < len; ++d) {
          ASSERT_EQ(b2[static_cast<size_t>(b) * S + d], bf[static_cast<size_t>(b) * S + d]) << "request " << b << " depth " << d;
        }
      }
      // The chosen child is a real token: row 0's best (not a fill value).
      const std::vector<int32_t> got = fused.row_tokens.download();
      for (int32_t t : got) ASSERT_GE(t, 0);
    }
  }
}

// chain_extend_inputs against the host's verify_greedy over the same chains: the accepted run,
// the emitted tokens (ids of the accepted rows), the last row and the copied features, for chains
// that accept nothing, part of the chain and all of it, with greedy tokens of -1 among them.
TEST(CudaDraftKernels, ChainExtendInputsFollowGreedyVerification) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary) + 3);
  std::uniform_int_distribution<int32_t> token_dist(0, 300);
  for (const int n : {2, 4, 8}) {
    for (const int batch : {1, 5, 16}) {
      SCOPED_TRACE(::testing::Message() << "num_draft_tokens " << n << " batch " << batch);
      std::vector<int32_t> ids(static_cast<size_t>(batch) * n), greedy(ids.size());
      for (auto& t : ids) t = token_dist(rng);
      for (int b = 0; b < batch; ++b) {
        // Request b agrees with its chain for its first (b mod n + rng) rows, then differs.
        const int agree = b == 0 ? n : static_cast<int>((b + rng()) % static_cast<uint64_t>(n));
        for (int q = 0; q < n; ++q) {
          const size_t at = static_cast<size_t>(b) * n + q;
          if (q < agree && q + 1 < n) {
            greedy[at] = ids[at + 1];
          } else {
            greedy[at] = rng() % 4 == 0 ? -1 : token_dist(rng);
          }
        }
      }
      const int width = 3 + static_cast<int>(rng() % 70);
      std::vector<float> features(ids.size() * static_cast<size_t>(width));
      for (float& f : features) f = static_cast<float>(token_dist(rng)) / 7.0f;
      DeviceArray<int32_t> d_ids(ids), d_greedy(greedy), d_ext(ids.size()), d_last(static_cast<size_t>(batch));
      DeviceArray<float> d_features(features), d_ext_features(features.size());
      d_ext.fill_bytes(0xff);
      d_ext_features.fill_bytes(0xff);
      ck::ChainExtendParams p{batch, n, d_ids.get(), d_greedy.get(), d_features.get(), width,
                              d_ext.get(), d_last.get(), d_ext_features.get()};
      ck::chain_extend_inputs(p, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<int32_t> ext = d_ext.download(), last = d_last.download();
      ASSERT_EQ(0, std::memcmp(d_ext_features.download().data(), features.data(), features.size() * sizeof(float)));
      for (int b = 0; b < batch; ++b) {
        const size_t base = static_cast<size_t>(b) * n;
        const DraftCandidates chain =
            chain_candidates(std::span<const int32_t>(ids).subspan(base + 1, static_cast<size_t>(n - 1)));
        const DraftTree tree = build_tree(ids[base], chain, n);
        const VerifyResult r =
            verify_greedy(tree, std::span<const int32_t>(greedy).subspan(base, static_cast<size_t>(n)));
        const auto a = static_cast<int>(r.accepted_nodes.size());
        ASSERT_EQ(last[static_cast<size_t>(b)], static_cast<int32_t>(base) + a - 1) << "request " << b;
        std::vector<int32_t> emitted = r.accepted_tokens;
        emitted.push_back(std::max(r.bonus_token, 0));
        for (int q = 0; q < a; ++q) {
          ASSERT_EQ(ext[base + static_cast<size_t>(q)], emitted[static_cast<size_t>(q)]) << "request " << b << " row " << q;
        }
        for (int q = a; q < n; ++q) ASSERT_GE(ext[base + static_cast<size_t>(q)], 0) << "request " << b << " row " << q;
      }
    }
  }
}

// ---- tree attention inputs for the graph test ------------------------------------------

// The draft head's attention at step `branch_len` of `batch` requests x k rows: random bf16
// q/K/V, paged prefixes (one empty), distinct branch slots per row. Host data; the params
// hold no device pointers yet. tree_attention's accuracy is tested in
// tests/attention/cuda_tree_attention_test.cpp.
TreeAttentionInputs make_attention_inputs(int batch, int k, int num_kv_heads, int group, int head_dim, int page_size,
                                          int branch_len, std::mt19937_64& rng) {
  TreeAttentionInputs in;
  const int rows = batch * k;
  in.prefix_lens.resize(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) in.prefix_lens[b] = b == 1 ? 0 : 1 + static_cast<int>(rng() % 500);
  const int max_prefix = *std::max_element(in.prefix_lens.begin(), in.prefix_lens.end());
  const int page_stride = std::max(1, (max_prefix + page_size - 1) / page_size);
  const int total_pages = batch * page_stride;
  std::vector<int32_t> pool(static_cast<size_t>(total_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  in.pages = pool;  // request b's pages are pool[b * page_stride ...]
  const int branch_stride = branch_len + 1;
  in.branch_slots.assign(static_cast<size_t>(rows) * branch_stride, -1);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < branch_len; ++i) {
      in.branch_slots[static_cast<size_t>(r) * branch_stride + i] = total_pages * page_size + r * branch_len + i;
    }
  }
  const TreeAttentionShape shape{.rows = rows,
                                 .rows_per_seq = k,
                                 .num_kv_heads = num_kv_heads,
                                 .group = group,
                                 .head_dim = head_dim,
                                 .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
                                 .page_stride = page_stride,
                                 .page_size = page_size,
                                 .branch_stride = branch_stride,
                                 .branch_len = branch_len};
  const size_t num_slots = static_cast<size_t>(total_pages) * page_size + static_cast<size_t>(rows) * branch_len;
  set_shape_and_random_qkv(in, shape, num_slots, rng);
  return in;
}

// ---- graph capture ----------------------------------------------------------------------

// One draft step (top-k of the root, init, attention, top-k of the rows, select) captured in a
// CUDA graph: every replay equals the eager run bit for bit.
TEST(CudaDraftKernels, CapturedInAGraphAndDeterministic) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary) + 3);
  constexpr int B = 3, K = 4, S = 3, H = 64, V = 32000;
  constexpr int rows = B * K;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  DeviceArray<float> root_logits(randn(static_cast<size_t>(B) * V)), step_logits(randn(static_cast<size_t>(rows) * V));
  DeviceArray<float> root_hidden(randn(static_cast<size_t>(B) * H)), step_hidden(randn(static_cast<size_t>(rows) * H));
  DeviceArray<int32_t> root_tokens(static_cast<size_t>(B) * K), child_tokens(static_cast<size_t>(rows) * K);
  DeviceArray<float> root_probs(static_cast<size_t>(B) * K), child_probs(static_cast<size_t>(rows) * K);
  std::vector<int32_t> slots(static_cast<size_t>((S - 1) * rows));
  std::iota(slots.begin(), slots.end(), 7);
  DraftTreeArrays tree(B, K, S, H, slots);
  const ck::DraftTreeState st = tree.state();
  DeviceTreeAttention attn(make_attention_inputs(B, K, 2, 4, 64, 16, 2, rng));

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  auto run_step = [&] {
    ck::draft_top_k({root_logits.get(), B, V, K, nullptr, root_tokens.get(), root_probs.get()}, stream);
    ck::draft_init(st, root_tokens.get(), root_probs.get(), root_hidden.get(), nullptr, stream);
    ck::tree_attention(attn.p, stream);
    ck::draft_top_k({step_logits.get(), rows, V, K, nullptr, child_tokens.get(), child_probs.get()}, stream);
    ck::draft_select(st, 1, child_tokens.get(), child_probs.get(), step_hidden.get(), stream);
  };
  auto snapshot = [&] {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint32_t> all;
    auto add = [&](const auto& v) {
      for (const auto& x : v) all.push_back(std::bit_cast<uint32_t>(x));
    };
    add(tree.cand_tokens.download());
    add(tree.cand_parents.download());
    add(tree.cand_scores.download());
    add(tree.frontier_scores.download());
    add(tree.row_tokens.download());
    add(tree.row_hidden.download());
    add(tree.branch.download());
    for (uint16_t x : attn.out.download()) all.push_back(x);
    return all;
  };
  auto scribble = [&] {
    for (DeviceArray<int32_t>* a :
         {&tree.cand_tokens, &tree.cand_parents, &tree.row_tokens, &tree.branch, &tree.frontier_nodes}) {
      a->fill_bytes(0x5a);
    }
    for (DeviceArray<float>* a : {&tree.cand_scores, &tree.frontier_scores, &tree.row_hidden}) a->fill_bytes(0x5a);
    attn.out.fill_bytes(0x5a);
    CUDA_CHECK(cudaDeviceSynchronize());  // the memsets run on the default stream
  };
  scribble();
  run_step();
  const std::vector<uint32_t> eager = snapshot();

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  run_step();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    scribble();
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    EXPECT_TRUE(snapshot() == eager) << "replay " << replay;
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace specula::testing
