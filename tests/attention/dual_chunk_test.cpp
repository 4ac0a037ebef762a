// Dual chunk attention on the CPU backend against a float64 reference that attends to the three
// parts (intra-chunk, successive chunk, earlier chunks) apart, each with its own softmax, and
// merges them by their log-sum-exps: prefill with a cached prefix and decode, GQA, paged, f32 and
// bf16 caches, through the backend's kernels (dual_chunk_parts.h) and the reference loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "specula/attention/backend.h"
#include "specula/attention/cpu/dual_chunk.h"
#include "specula/batch/forward_batch.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

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
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int D = c.head_dim, Hq = c.q_heads, Hkv = c.kv_heads, G = Hq / Hkv, ps = c.page_size;
  const int n_req = static_cast<int>(c.requests.size());
  int longest = 1;
  int64_t pages = 0;
  for (auto [prefix, extend] : c.requests) {
    longest = std::max(longest, prefix + extend);
    pages += (prefix + extend + ps - 1) / ps;
  }
  MHAKVPool pool(KVPoolConfig{(pages + 1) * ps, 1, Hkv, D, D, c.kv_dtype, Device::cpu()});
  ReqToTokenPool rows(n_req, longest);
  AttentionLayer layer;
  layer.num_q_heads = Hq;
  layer.num_kv_heads = Hkv;
  layer.head_dim = D;
  layer.logit_cap = c.logit_cap;
  layer.dca_chunk_len = c.chunk_len;
  layer.dca_original_max_position = c.original_max;
  AttentionBackendOptions options;
  options.page_size = ps;
  auto backend = make_attention_backend("cpu", options);
  backend->check_layer(layer, DType::f32, c.kv_dtype);
  auto cached = [&](float x) {
    return c.kv_dtype == DType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(x)) : x;
  };

  // Every token's K and V (the prefix written straight into the pool, the new ones by the step).
  std::vector<std::vector<int32_t>> slots(static_cast<size_t>(n_req));
  std::vector<std::vector<float>> keys(static_cast<size_t>(n_req)), values(static_cast<size_t>(n_req));
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 1);
  std::shuffle(order.begin(), order.end(), rng);
  size_t next = 0;
  ForwardBatch batch;
  batch.forward_mode = c.mode;
  batch.batch_size = n_req;
  batch.req_to_token_pool = &rows;
  batch.token_to_kv_pool = &pool;
  std::vector<float> q, k_new, v_new;
  for (int r = 0; r < n_req; ++r) {
    const auto [prefix, extend] = c.requests[static_cast<size_t>(r)];
    const int len = prefix + extend;
    auto& s = slots[static_cast<size_t>(r)];
    for (int t = 0; t < len; ++t) {
      if (t % ps == 0) ++next;
      s.push_back(order[next - 1] * ps + t % ps);
    }
    rows.write(r, 0, s);
    auto& kr = keys[static_cast<size_t>(r)];
    auto& vr = values[static_cast<size_t>(r)];
    kr.resize(static_cast<size_t>(len) * Hkv * D);
    vr.resize(kr.size());
    for (float& x : kr) x = cached(unit(rng));
    for (float& x : vr) x = cached(unit(rng));
    if (prefix > 0) {
      pool.set_kv_buffer(0, std::span<const int32_t>(s.data(), static_cast<size_t>(prefix)),
                         TensorView(kr.data(), DType::f32, {prefix, Hkv, D}), TensorView(vr.data(), DType::f32, {prefix, Hkv, D}));
    }
    batch.req_pool_indices.push_back(r);
    batch.seq_lens.push_back(len);
    if (c.mode != ForwardMode::DECODE) {
      batch.extend_prefix_lens.push_back(prefix);
      batch.extend_seq_lens.push_back(extend);
    }
    for (int t = prefix; t < len; ++t) {
      batch.out_cache_loc.push_back(s[static_cast<size_t>(t)]);
      batch.positions.push_back(t);
      for (int i = 0; i < Hq * 3 * D; ++i) q.push_back(unit(rng) * 2.0f);
      k_new.insert(k_new.end(), kr.begin() + static_cast<int64_t>(t) * Hkv * D, kr.begin() + static_cast<int64_t>(t + 1) * Hkv * D);
      v_new.insert(v_new.end(), vr.begin() + static_cast<int64_t>(t) * Hkv * D, vr.begin() + static_cast<int64_t>(t + 1) * Hkv * D);
    }
  }
  const int64_t n = batch.num_tokens();
  std::vector<float> out(static_cast<size_t>(n) * Hq * D), lse(static_cast<size_t>(n) * Hq);
  ForwardOptions fo;
  fo.lse = TensorView(lse.data(), DType::f32, {n, Hq});
  backend->init_forward_metadata(batch);
  backend->forward(TensorView(q.data(), DType::f32, {n, Hq, 3 * D}), TensorView(k_new.data(), DType::f32, {n, Hkv, D}),
                   TensorView(v_new.data(), DType::f32, {n, Hkv, D}), TensorView(out.data(), DType::f32, {n, Hq, D}),
                   layer, batch, fo);

  // The reference: three softmaxes per query, merged.
  double max_err = 0.0, max_lse_err = 0.0;
  int64_t row = 0;
  int parts_seen = 0;
  for (int r = 0; r < n_req; ++r) {
    const auto [prefix, extend] = c.requests[static_cast<size_t>(r)];
    const int len = prefix + extend;
    const double temperature = c.original_max > 0 ? std::max(1.0, 0.1 * std::log(static_cast<double>(len) / c.original_max) + 1.0) : 1.0;
    for (int pos = prefix; pos < len; ++pos, ++row) {
      const int cq = pos / c.chunk_len;
      const int bounds[4] = {0, std::max(0, (cq - 1) * c.chunk_len), cq * c.chunk_len, pos + 1};
      for (int h = 0; h < Hq; ++h) {
        const int kh = h / G;
        std::vector<double> part_lse, part_out;
        for (int part = 0; part < 3; ++part) {  // inter, successive, intra
          const int lo = bounds[part], hi = part == 0 ? std::max(0, (cq - 1) * c.chunk_len) : bounds[part + 1];
          if (lo >= hi) continue;
          const int variant = 2 - part;
          const float* qv = q.data() + ((row * Hq + h) * 3 + variant) * D;
          std::vector<double> s;
          for (int j = lo; j < hi; ++j) {
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * keys[static_cast<size_t>(r)][(static_cast<size_t>(j) * Hkv + kh) * D + d];
            double x = dot / std::sqrt(static_cast<double>(D)) * temperature;
            if (c.logit_cap > 0) x = c.logit_cap * std::tanh(x / c.logit_cap);
            s.push_back(x);
          }
          const double m = *std::max_element(s.begin(), s.end());
          double z = 0;
          for (double x : s) z += std::exp(x - m);
          part_lse.push_back(m + std::log(z));
          std::vector<double> o(static_cast<size_t>(D), 0.0);
          for (int j = lo; j < hi; ++j) {
            const double pj = std::exp(s[static_cast<size_t>(j - lo)] - m) / z;
            for (int d = 0; d < D; ++d) o[static_cast<size_t>(d)] += pj * values[static_cast<size_t>(r)][(static_cast<size_t>(j) * Hkv + kh) * D + d];
          }
          part_out.insert(part_out.end(), o.begin(), o.end());
          ++parts_seen;
        }
        const double m = *std::max_element(part_lse.begin(), part_lse.end());
        double z = 0;
        for (double l : part_lse) z += std::exp(l - m);
        const double total = m + std::log(z);
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (size_t pt = 0; pt < part_lse.size(); ++pt) o += std::exp(part_lse[pt] - total) * part_out[pt * D + static_cast<size_t>(d)];
          max_err = std::max(max_err, std::abs(o - out[static_cast<size_t>((row * Hq + h) * D + d)]));
        }
        max_lse_err = std::max(max_lse_err, std::abs(total - lse[static_cast<size_t>(row * Hq + h)]));
      }
    }
  }
  EXPECT_LE(max_err, 2e-5);
  EXPECT_LE(max_lse_err, 2e-5);
  EXPECT_GT(parts_seen, static_cast<int>(n) * Hq);  // some queries see more than one part
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
