// Dual chunk attention on the CPU backend against a float64 reference that attends to the three
// parts (intra-chunk, successive chunk, earlier chunks) apart, each with its own softmax, and
// merges them by their log-sum-exps: prefill with a cached prefix and decode, GQA, paged, f32 and
// bf16 caches, through the backend's kernels (dual_chunk_parts.h) and the reference loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "dual_chunk_fixture.h"
#include "specula/attention/backend.h"
#include "specula/attention/cpu/dual_chunk.h"
#include "specula/core/error.h"

namespace specula {
namespace {

struct DcaCase {
  const char* name;
  ForwardMode mode;
  std::vector<std::pair<int, int>> requests;  // (cached prefix, new tokens)
  int chunk_len, original_max, page_size;
  int q_heads = 4, kv_heads = 2, head_dim = 64;
  float logit_cap = 0.0f;
  DType kv_dtype = DType::f32;  // bf16: the reference reads the rounded keys and values
};

void PrintTo(const DcaCase& c, std::ostream* os) { *os << c.name; }

class CpuDualChunk : public ::testing::TestWithParam<DcaCase> {};

TEST_P(CpuDualChunk, MatchesThreePartsMergedByLse) {
  const DcaCase& c = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int D = c.head_dim, Hq = c.q_heads, Hkv = c.kv_heads, G = Hq / Hkv;
  AttentionLayer layer;
  layer.num_q_heads = Hq;
  layer.num_kv_heads = Hkv;
  layer.head_dim = D;
  layer.logit_cap = c.logit_cap;
  layer.dca_chunk_len = c.chunk_len;
  layer.dca_original_max_position = c.original_max;
  const test::DcaRun run = test::run_dual_chunk_layer(layer, c.mode, c.requests, c.page_size, c.kv_dtype, 2.0f, rng);

  // The reference: three softmaxes per query, merged.
  const double scale = layer.effective_scaling();
  double max_err = 0.0, max_lse_err = 0.0;
  int parts_seen = 0, rows = 0;
  for (const test::DcaRequest& rq : run.requests) {
    const double temperature =
        c.original_max > 0 ? std::max(1.0, 0.1 * std::log(static_cast<double>(rq.len) / c.original_max) + 1.0) : 1.0;
    for (int pos = rq.prefix; pos < rq.len; ++pos, ++rows) {
      const int64_t row = rq.first_row + pos - rq.prefix;
      const int cq = pos / c.chunk_len;
      for (int h = 0; h < Hq; ++h) {
        std::vector<test::DcaPart> parts;
        for (int part = 0; part < 3; ++part) {  // inter, successive, intra
          const int lo = part == 0 ? 0 : part == 1 ? std::max(0, (cq - 1) * c.chunk_len) : cq * c.chunk_len;
          const int hi = part == 0 ? std::max(0, (cq - 1) * c.chunk_len) : part == 1 ? cq * c.chunk_len : pos + 1;
          if (lo >= hi) continue;
          const float* qv = run.q.data() + ((row * Hq + h) * 3 + (2 - part)) * D;
          std::vector<int> keys;
          std::vector<double> logits;
          for (int j = lo; j < hi; ++j) {
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * rq.keys[(static_cast<size_t>(j) * Hkv + h / G) * D + d];
            double x = dot * scale * temperature;
            if (c.logit_cap > 0) x = c.logit_cap * std::tanh(x / c.logit_cap);
            keys.push_back(j);
            logits.push_back(x);
          }
          parts.push_back(test::attend_keys(logits, keys, rq, h / G, Hkv, D));
        }
        parts_seen += static_cast<int>(parts.size());
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
  EXPECT_GT(parts_seen, rows * Hq);  // some queries see more than one part
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuDualChunk,
    ::testing::Values(DcaCase{"prefill", ForwardMode::EXTEND, {{0, 75}, {0, 20}}, 16, 0, 1},
                      DcaCase{"extend_paged_scaled", ForwardMode::EXTEND, {{37, 30}, {50, 3}}, 16, 20, 4},
                      DcaCase{"decode_capped", ForwardMode::DECODE, {{70, 1}, {15, 1}, {33, 1}}, 16, 0, 4, 8, 2, 64, 20.0f},
                      DcaCase{"decode_mha_d128", ForwardMode::DECODE, {{100, 1}, {47, 1}}, 24, 30, 8, 2, 2, 128},
                      // Chunks not a whole number of pages: the reference loop instead of the kernels.
                      DcaCase{"extend_pages_unaligned", ForwardMode::EXTEND, {{37, 30}, {50, 3}}, 20, 20, 8},
                      // bf16 caches: the tile kernel, and (AVX512-BF16 processors) the decode kernel for one-token rows.
                      DcaCase{"prefill_bf16", ForwardMode::EXTEND, {{0, 90}, {40, 41}}, 32, 0, 4, 8, 2, 128, 0.0f,
                              DType::bf16},
                      DcaCase{"decode_bf16_long", ForwardMode::DECODE, {{300, 1}, {130, 1}, {20, 1}}, 32, 64, 16, 4, 2,
                              128, 0.0f, DType::bf16}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(CpuDualChunkErrors, RefusesWhatItCannotServe) {
  auto backend = make_attention_backend("cpu", {});
  AttentionLayer layer;
  layer.num_q_heads = layer.num_kv_heads = 2;
  layer.head_dim = 64;
  layer.dca_chunk_len = 16;
  layer.sliding_window_size = 8;
  try {
    backend->check_layer(layer, DType::f32, DType::f32);
    FAIL() << "a windowed dual-chunk layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dual chunk attention serves causal layers without sliding window"),
              std::string::npos)
        << e.what();
  }
  EXPECT_DOUBLE_EQ(dual_chunk_logit_scale(1000, 0), 1.0);
  EXPECT_DOUBLE_EQ(dual_chunk_logit_scale(100, 1000), 1.0);
  EXPECT_NEAR(dual_chunk_logit_scale(1 << 20, 32768), 0.1 * std::log(32.0) + 1.0, 1e-12);
}

}  // namespace
}  // namespace specula
