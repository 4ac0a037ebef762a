// Dual chunk attention's sparse prefill (the vertical-and-slash pattern) on the CPU backend
// against a float64 reference that materialises the pattern from scratch: for each run of new
// tokens in one chunk and each query head, the full probability matrix of the run's last
// queries, its column and diagonal sums, the kept lines by a stable sort, and then the three
// parts (inter, successive, intra) over the kept keys, each with its own softmax, merged by their
// log-sum-exps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "dual_chunk_fixture.h"
#include "specula/attention/backend.h"
#include "specula/attention/cpu/dual_chunk_sparse.h"
#include "specula/core/error.h"

namespace specula {
namespace {

struct SparseCase {
  const char* name;
  ForwardMode mode;
  std::vector<std::pair<int, int>> requests;  // (cached prefix, new tokens)
  int chunk_len, threshold, last_q, forced_vertical, forced_slash;
  std::vector<int32_t> vertical, slash;  // per query head
  int kv_heads = 2, head_dim = 64, page_size = 4, original_max = 0;
  float logit_cap = 0.0f;
  bool drops = true;  // whether some visible keys must be left out
};

void PrintTo(const SparseCase& c, std::ostream* os) { *os << c.name; }

class CpuDualChunkSparse : public ::testing::TestWithParam<SparseCase> {};

TEST_P(CpuDualChunkSparse, MatchesThePatternMaterialisedInFloat64) {
  const SparseCase& c = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int Hq = static_cast<int>(c.vertical.size()), Hkv = c.kv_heads, D = c.head_dim;
  const int G = Hq / Hkv, V = 5;
  auto pattern = std::make_shared<DualChunkSparsePattern>();
  pattern->threshold = c.threshold;
  pattern->last_q = c.last_q;
  pattern->forced_vertical = c.forced_vertical;
  pattern->forced_slash = c.forced_slash;
  pattern->vertical = c.vertical;
  pattern->slash = c.slash;
  AttentionLayer layer;
  layer.num_q_heads = Hq;
  layer.num_kv_heads = Hkv;
  layer.head_dim = D;
  layer.logit_cap = c.logit_cap;
  layer.dca_chunk_len = c.chunk_len;
  layer.dca_original_max_position = c.original_max;
  layer.dca_sparse = pattern;
  ASSERT_EQ(layer.dca_q_variants(), 5);
  // Queries 2.5x the keys' scale: peaked rows, so the pattern decides something.
  const test::DcaRun run = test::run_dual_chunk_layer(layer, c.mode, c.requests, c.page_size, DType::f32, 2.5f, rng);

  // The layer's scale as the backend takes it (a float), so that both sides pick lines from the
  // same logits up to double rounding.
  const double inv_sqrt_d = static_cast<double>(layer.effective_scaling());
  double max_err = 0.0, max_lse_err = 0.0, min_gap = INFINITY;
  int64_t visible = 0, kept = 0;
  int parts_kept[3] = {0, 0, 0};  // inter, successive, intra parts with a kept key
  for (const test::DcaRequest& rq : run.requests) {
    const double temperature =
        c.original_max > 0 ? std::max(1.0, 0.1 * std::log(static_cast<double>(rq.len) / c.original_max) + 1.0) : 1.0;
    const bool sparse = c.mode != ForwardMode::DECODE && rq.len - rq.prefix > 1 && rq.len > c.threshold;
    auto query = [&](int pos, int h, int variant) {
      return run.q.data() + ((rq.first_row + pos - rq.prefix) * Hq + h) * V * D + variant * D;
    };
    auto logit = [&](const float* qv, int j, int h) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * rq.keys[(static_cast<size_t>(j) * Hkv + h / G) * D + d];
      double x = dot * inv_sqrt_d * temperature;
      if (c.logit_cap > 0) x = c.logit_cap * std::tanh(x / c.logit_cap);
      return x;
    };
    // Kept lines per (run's chunk, head): [chunk][head] -> (columns, distances).
    std::vector<std::vector<std::pair<std::vector<bool>, std::vector<bool>>>> lines;
    if (sparse) {
      for (int cq = rq.prefix / c.chunk_len; cq <= (rq.len - 1) / c.chunk_len; ++cq) {
        const int begin = std::max(rq.prefix, cq * c.chunk_len), end = std::min(rq.len, (cq + 1) * c.chunk_len);
        const int nq = std::min(end - begin, c.last_q);
        auto& per_head = lines.emplace_back();
        for (int h = 0; h < Hq; ++h) {
          // The full [nq, end] probability matrix, zero above the diagonal.
          std::vector<std::vector<double>> prob(static_cast<size_t>(nq), std::vector<double>(static_cast<size_t>(end), 0.0));
          for (int i = 0; i < nq; ++i) {
            const int pos = end - nq + i;
            std::vector<double> s(static_cast<size_t>(pos + 1));
            for (int j = 0; j <= pos; ++j) {
              const int kc = j / c.chunk_len;
              s[static_cast<size_t>(j)] = logit(query(pos, h, kc == cq ? 0 : kc == cq - 1 ? 3 : 4), j, h);
            }
            const double m = *std::max_element(s.begin(), s.end());
            double z = 0;
            for (double x : s) z += std::exp(x - m);
            for (int j = 0; j <= pos; ++j) prob[static_cast<size_t>(i)][static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - m) / z;
          }
          std::vector<double> column(static_cast<size_t>(end), 0.0), diagonal(static_cast<size_t>(end), 0.0);
          for (int j = 0; j < end; ++j) {
            for (int i = 0; i < nq; ++i) column[static_cast<size_t>(j)] += prob[static_cast<size_t>(i)][static_cast<size_t>(j)];
          }
          for (int o = 0; o < end; ++o) {
            for (int i = 0; i < nq; ++i) {
              const int j = end - nq + i - o;
              if (j >= 0) diagonal[static_cast<size_t>(o)] += prob[static_cast<size_t>(i)][static_cast<size_t>(j)];
            }
          }
          for (int j = 0; j < std::min(c.forced_vertical, end); ++j) column[static_cast<size_t>(j)] = INFINITY;
          for (int o = 0; o < std::min(c.forced_slash, end); ++o) diagonal[static_cast<size_t>(o)] = INFINITY;
          auto keep = [&](const std::vector<double>& score, int count) {
            std::vector<int> idx(score.size());
            std::iota(idx.begin(), idx.end(), 0);
            std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)]; });
            const size_t k = std::min(score.size(), static_cast<size_t>(count));
            if (k > 0 && k < idx.size() && std::isfinite(score[static_cast<size_t>(idx[k - 1])])) {
              min_gap = std::min(min_gap, score[static_cast<size_t>(idx[k - 1])] - score[static_cast<size_t>(idx[k])]);
            }
            std::vector<bool> mask(score.size(), false);
            for (size_t i = 0; i < k; ++i) mask[static_cast<size_t>(idx[i])] = true;
            return mask;
          };
          per_head.emplace_back(keep(column, c.vertical[static_cast<size_t>(h)]), keep(diagonal, c.slash[static_cast<size_t>(h)]));
        }
      }
    }
    for (int pos = rq.prefix; pos < rq.len; ++pos) {
      const int cq = pos / c.chunk_len;
      const int64_t row = rq.first_row + pos - rq.prefix;
      for (int h = 0; h < Hq; ++h) {
        const auto* kept_lines = sparse ? &lines[static_cast<size_t>(cq - rq.prefix / c.chunk_len)][static_cast<size_t>(h)] : nullptr;
        std::vector<test::DcaPart> parts;
        for (int part = 0; part < 3; ++part) {  // inter, successive, intra
          const int lo = part == 0 ? 0 : part == 1 ? std::max(0, (cq - 1) * c.chunk_len) : cq * c.chunk_len;
          const int hi = part == 0 ? std::max(0, (cq - 1) * c.chunk_len) : part == 1 ? cq * c.chunk_len : pos + 1;
          std::vector<int> keys;
          for (int j = lo; j < hi; ++j) {
            ++visible;
            if (kept_lines == nullptr || kept_lines->first[static_cast<size_t>(j)] || kept_lines->second[static_cast<size_t>(pos - j)]) keys.push_back(j);
          }
          kept += static_cast<int64_t>(keys.size());
          if (keys.empty()) continue;
          ++parts_kept[part];
          const float* qv = query(pos, h, 2 - part);
          std::vector<double> logits;
          for (int j : keys) logits.push_back(logit(qv, j, h));
          parts.push_back(test::attend_keys(logits, keys, rq, h / G, Hkv, D));
        }
        const test::DcaPart want = test::merge_parts(parts, D);
        for (int d = 0; d < D; ++d) {
          max_err = std::max(max_err, std::abs(want.out[static_cast<size_t>(d)] - run.out[static_cast<size_t>((row * Hq + h) * D + d)]));
        }
        max_lse_err = std::max(max_lse_err, std::abs(want.lse - run.lse[static_cast<size_t>(row * Hq + h)]));
      }
    }
  }
  EXPECT_LE(max_err, 2e-5);
  EXPECT_LE(max_lse_err, 2e-5);
  // A kept line decided by a near tie could go either way between two summation orders.
  EXPECT_GT(min_gap, 1e-12);
  if (c.drops) {
    EXPECT_LT(kept, visible * 9 / 10) << kept << " of " << visible << " visible keys kept";
    EXPECT_GT(parts_kept[0], 0);  // kept keys in every part
    EXPECT_GT(parts_kept[1], 0);
  } else {
    EXPECT_EQ(kept, visible);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, CpuDualChunkSparse,
    ::testing::Values(
        // Four chunks of one prompt; heads keep from no vertical line to many. A prompt of exactly
        // the threshold attends densely.
        SparseCase{"prefill_four_chunks", ForwardMode::EXTEND, {{0, 150}, {0, 100}}, 40, 100, 8, 3, 4, {5, 10, 0, 20},
                   {1, 6, 12, 3}},
        // A cached prefix and a run crossing a chunk boundary, with the long-context temperature; a
        // short request (below the threshold) and a one-token run stay dense.
        SparseCase{"extend_mixed_lengths", ForwardMode::EXTEND, {{70, 60}, {0, 50}, {120, 1}}, 32, 100, 6, 2, 3,
                   {4, 9, 2, 7}, {5, 2, 8, 3}, 2, 64, 8, 40},
        // GQA groups of four, soft-capped, last_q longer than some runs, pages of one.
        SparseCase{"gqa_capped", ForwardMode::MIXED, {{90, 45}, {0, 140}}, 48, 120, 64, 1, 2,
                   {3, 6, 9, 12, 1, 30, 2, 4}, {2, 4, 6, 8, 10, 1, 3, 5}, 2, 80, 1, 0, 15.0f},
        // Lines enough for every key: the dense result.
        SparseCase{"everything_kept", ForwardMode::EXTEND, {{30, 100}}, 40, 50, 8, 3, 4, {200, 0, 5, 300}, {1, 200, 300, 130},
                   2, 64, 4, 0, 0.0f, false},
        // Decode rows attend densely even past the threshold.
        SparseCase{"decode_dense", ForwardMode::DECODE, {{130, 1}, {170, 1}}, 40, 100, 8, 3, 4, {1, 1, 1, 1}, {1, 1, 1, 1},
                   2, 128, 4, 0, 0.0f, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(CpuDualChunkSparse, TopScoresKeepsTheLargestAndTheLowerIndexOnTies) {
  const std::vector<double> s = {0.5, INFINITY, 0.25, 0.5, INFINITY, 0.75};
  auto kept = [&](int k) {
    std::vector<int> out;
    const std::vector<bool> m = top_scores(s, k);
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i]) out.push_back(static_cast<int>(i));
    }
    return out;
  };
  EXPECT_EQ(kept(1), std::vector<int>({1}));
  EXPECT_EQ(kept(3), std::vector<int>({1, 4, 5}));
  EXPECT_EQ(kept(4), std::vector<int>({0, 1, 4, 5}));
  EXPECT_EQ(kept(0), std::vector<int>());
  EXPECT_EQ(kept(99), std::vector<int>({0, 1, 2, 3, 4, 5}));
}

TEST(CpuDualChunkSparse, RefusesPatternsItCannotServe) {
  auto backend = make_attention_backend("cpu", {});
  AttentionLayer layer;
  layer.num_q_heads = 4;
  layer.num_kv_heads = 2;
  layer.head_dim = 64;
  auto refused = [&](const DualChunkSparsePattern& pattern, int chunk_len, const std::string& fragment) {
    layer.dca_chunk_len = chunk_len;
    layer.dca_sparse = std::make_shared<DualChunkSparsePattern>(pattern);
    try {
      backend->check_layer(layer, DType::f32, DType::f32);
      ADD_FAILURE() << "accepted; expected '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  DualChunkSparsePattern ok;
  ok.vertical = {1, 2, 3, 4};
  ok.slash = {1, 2, 3, 4};
  refused(ok, 0, "needs dual chunk attention");
  DualChunkSparsePattern short_list = ok;
  short_list.slash.pop_back();
  refused(short_list, 16, "expected one per query head (4)");
  DualChunkSparsePattern no_slash = ok;
  no_slash.slash[2] = 0;
  refused(no_slash, 16, "query head 2 keeps 3 vertical and 0 slash lines");
  DualChunkSparsePattern no_last_q = ok;
  no_last_q.last_q = 0;
  refused(no_last_q, 16, "last_q 0");
  layer.dca_sparse = std::make_shared<DualChunkSparsePattern>(ok);
  layer.dca_chunk_len = 16;
  EXPECT_NO_THROW(backend->check_layer(layer, DType::f32, DType::f32));
}

}  // namespace
}  // namespace specula
