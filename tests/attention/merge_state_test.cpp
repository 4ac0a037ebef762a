// merge_state: merging two partial attentions over disjoint key sets equals attention over the
// union (checked end to end with the CPU backend's LSE output), plus the -inf / empty cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "specula/attention/merge_state.h"

namespace specula {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Attention of one query row over keys [begin, end) in double: returns (out, lse).
std::pair<std::vector<double>, double> partial(const std::vector<double>& scores, const std::vector<double>& values, int d,
                                               int begin, int end) {
  std::vector<double> out(static_cast<size_t>(d), 0.0);
  if (begin == end) return {out, -INFINITY};
  double m = -INFINITY;
  for (int j = begin; j < end; ++j) m = std::max(m, scores[static_cast<size_t>(j)]);
  double l = 0;
  for (int j = begin; j < end; ++j) {
    const double p = std::exp(scores[static_cast<size_t>(j)] - m);
    l += p;
    for (int i = 0; i < d; ++i) out[static_cast<size_t>(i)] += p * values[static_cast<size_t>(j * d + i)];
  }
  for (double& x : out) x /= l;
  return {out, m + std::log(l)};
}

TEST(MergeState, EqualsAttentionOverTheUnion) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<double> dist(0.0, 2.0);
  const int n = 7, h = 3, d = 16, keys = 40;
  Buffer va(DType::f32, {n, h, d}), vb(DType::f32, {n, h, d}), vo(DType::f32, {n, h, d});
  Buffer sa(DType::f32, {n, h}), sb(DType::f32, {n, h}), so(DType::f32, {n, h});
  std::vector<std::vector<double>> expect_out;
  std::vector<double> expect_lse;
  for (int row = 0; row < n * h; ++row) {
    std::vector<double> scores(keys), values(static_cast<size_t>(keys * d));
    for (double& s : scores) s = dist(rng);
    for (double& v : values) v = dist(rng);
    const int split = static_cast<int>(rng() % (keys + 1));  // includes empty parts
    auto [oa, la] = partial(scores, values, d, 0, split);
    auto [ob, lb] = partial(scores, values, d, split, keys);
    auto [oall, lall] = partial(scores, values, d, 0, keys);
    for (int i = 0; i < d; ++i) {
      va.data_as<float>()[row * d + i] = static_cast<float>(oa[static_cast<size_t>(i)]);
      vb.data_as<float>()[row * d + i] = static_cast<float>(ob[static_cast<size_t>(i)]);
    }
    sa.data_as<float>()[row] = static_cast<float>(la);
    sb.data_as<float>()[row] = static_cast<float>(lb);
    expect_out.push_back(oall);
    expect_lse.push_back(lall);
  }
  merge_state(va, sa, vb, sb, vo, so);
  for (int row = 0; row < n * h; ++row) {
    EXPECT_NEAR(so.data_as<float>()[row], expect_lse[static_cast<size_t>(row)], 1e-5);
    for (int i = 0; i < d; ++i) {
      EXPECT_NEAR(vo.data_as<float>()[row * d + i], expect_out[static_cast<size_t>(row)][static_cast<size_t>(i)], 2e-5);
    }
  }
}

TEST(MergeState, EmptyPartsAndBothEmpty) {
  const int d = 4;
  Buffer va(DType::f32, {1, 3, d}), vb(DType::f32, {1, 3, d}), vo(DType::f32, {1, 3, d});
  Buffer sa(DType::f32, {1, 3}), sb(DType::f32, {1, 3}), so(DType::f32, {1, 3});
  for (int i = 0; i < 3 * d; ++i) {
    va.data_as<float>()[i] = 1.0f + static_cast<float>(i);
    vb.data_as<float>()[i] = NAN;  // an empty state's value must be ignored, even if NaN
  }
  const float s[3][2] = {{0.7f, kNegInf}, {kNegInf, kNegInf}, {-3.0f, kNegInf}};
  for (int r = 0; r < 3; ++r) {
    sa.data_as<float>()[r] = s[r][0];
    sb.data_as<float>()[r] = s[r][1];
  }
  sa.data_as<float>()[1] = kNegInf;
  merge_state(va, sa, vb, sb, vo, so);
  for (int i = 0; i < d; ++i) {
    EXPECT_EQ(vo.data_as<float>()[i], va.data_as<float>()[i]);
    EXPECT_EQ(vo.data_as<float>()[d + i], 0.0f);
    EXPECT_EQ(vo.data_as<float>()[2 * d + i], va.data_as<float>()[2 * d + i]);
  }
  EXPECT_FLOAT_EQ(so.data_as<float>()[0], 0.7f);
  EXPECT_EQ(so.data_as<float>()[1], kNegInf);
  EXPECT_FLOAT_EQ(so.data_as<float>()[2], -3.0f);
}

TEST(MergeState, Bf16ValuesAndShapeErrors) {
  Buffer va(DType::bf16, {2, 2, 8}), vb(DType::bf16, {2, 2, 8}), vo(DType::bf16, {2, 2, 8});
  Buffer sa(DType::f32, {2, 2}), sb(DType::f32, {2, 2}), so(DType::f32, {2, 2});
  for (int i = 0; i < 32; ++i) {
    store_from_float(va.data(), DType::bf16, static_cast<size_t>(i), 0.25f * static_cast<float>(i));
    store_from_float(vb.data(), DType::bf16, static_cast<size_t>(i), -1.5f);
  }
  for (int i = 0; i < 4; ++i) {
    sa.data_as<float>()[i] = std::log(3.0f);
    sb.data_as<float>()[i] = 0.0f;  // weights 3 : 1
  }
  merge_state(va, sa, vb, sb, vo, so);
  for (int i = 0; i < 32; ++i) {
    const float want = (3.0f * 0.25f * static_cast<float>(i) - 1.5f) / 4.0f;
    EXPECT_NEAR(load_as_float(vo.data(), DType::bf16, static_cast<size_t>(i)), want, std::fabs(want) * 8e-3 + 1e-6);
  }
  EXPECT_NEAR(so.data_as<float>()[0], std::log(4.0f), 1e-6);
  Buffer bad(DType::f32, {2, 3});
  EXPECT_THROW(merge_state(va, bad, vb, sb, vo, so), Error);
}

}  // namespace
}  // namespace specula
