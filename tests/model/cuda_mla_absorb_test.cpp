// The absorbed MLA products for a few tokens (mla_absorb.h) against float64 over random inputs:
// DeepSeek's shape (16 heads, nope 128, v 128, rank 512), a rank that leaves a partial column
// block and partial lane chunks (132), odd head counts and widths, strided query rows; nothing
// outside the outputs is written; shapes they do not take are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/device.h"
#include "specula/model/cuda/mla_absorb.h"

namespace specula {
namespace {

namespace ck = cuda_kernels;
using testing::DeviceArray;
using testing::from_bf16;
using testing::to_bf16;

struct AbsorbCase {
  int n, heads, nope, vd, rank, q_pad;  // q_pad: floats between one token's query row and the next
};

class CudaMlaAbsorb : public ::testing::TestWithParam<AbsorbCase> {};

TEST_P(CudaMlaAbsorb, MatchesFloat64) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const AbsorbCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(testing::test_seed("cuda_model_test")) ^ 0xab5 ^ static_cast<uint32_t>(c.rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int qk = c.nope + 64;  // a head's query: nope values, then 64 RoPE values the products skip
  const int64_t q_stride = static_cast<int64_t>(c.heads) * qk + c.q_pad, rows = static_cast<int64_t>(c.heads) * (c.nope + c.vd);
  std::vector<float> q(static_cast<size_t>(c.n * q_stride)), w(static_cast<size_t>(rows * c.rank));
  std::vector<uint16_t> o(static_cast<size_t>(c.n) * c.heads * c.rank);
  for (float& v : q) v = normal(rng);
  for (float& v : w) v = 0.05f * normal(rng);
  for (uint16_t& v : o) v = to_bf16(normal(rng));
  const int64_t latent = static_cast<int64_t>(c.n) * c.heads * c.rank, values = static_cast<int64_t>(c.n) * c.heads * c.vd;
  constexpr int kTail = 64;  // sentinel floats past each output
  DeviceArray<float> dq(q), dw(w), dlatent(static_cast<size_t>(latent + kTail)), dvalues(static_cast<size_t>(values + kTail));
  DeviceArray<uint16_t> dout(o);
  dlatent.fill_bytes(0xff);
  dvalues.fill_bytes(0xff);
  ck::mla_absorb_uk(dq.get(), q_stride, qk, dw.get(), dlatent.get(), c.n, c.heads, c.nope, c.vd, c.rank, nullptr);
  ck::mla_absorb_uv(dout.get(), dw.get(), dvalues.get(), c.n, c.heads, c.nope, c.vd, c.rank, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got_latent = dlatent.download(), got_values = dvalues.download();
  double worst = 0;
  for (int t = 0; t < c.n; ++t) {
    for (int h = 0; h < c.heads; ++h) {
      const int64_t head = static_cast<int64_t>(h) * (c.nope + c.vd);
      for (int r = 0; r < c.rank; ++r) {
        double want = 0, mag = 0;
        for (int d = 0; d < c.nope; ++d) {
          const double term = double{q[static_cast<size_t>(t * q_stride + h * qk + d)]} *
                              w[static_cast<size_t>((head + d) * c.rank + r)];
          want += term;
          mag += std::fabs(term);
        }
        const float got = got_latent[static_cast<size_t>((static_cast<int64_t>(t) * c.heads + h) * c.rank + r)];
        worst = std::max(worst, std::fabs(got - want));
        ASSERT_NEAR(got, want, 1e-5 * (1.0 + mag)) << "q_latent token " << t << " head " << h << " column " << r;
      }
      for (int v = 0; v < c.vd; ++v) {
        double want = 0, mag = 0;
        for (int r = 0; r < c.rank; ++r) {
          const double term = double{from_bf16(o[static_cast<size_t>((static_cast<int64_t>(t) * c.heads + h) * c.rank + r)])} *
                              w[static_cast<size_t>((head + c.nope + v) * c.rank + r)];
          want += term;
          mag += std::fabs(term);
        }
        const float got = got_values[static_cast<size_t>((static_cast<int64_t>(t) * c.heads + h) * c.vd + v)];
        worst = std::max(worst, std::fabs(got - want));
        ASSERT_NEAR(got, want, 1e-5 * (1.0 + mag)) << "values token " << t << " head " << h << " value " << v;
      }
    }
  }
  EXPECT_GT(worst, 0.0);  // f32 sums, not the reference copied
  for (int i = 0; i < kTail; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got_latent[static_cast<size_t>(latent + i)]), 0xffffffffu) << "q_latent tail " << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(got_values[static_cast<size_t>(values + i)]), 0xffffffffu) << "values tail " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMlaAbsorb,
                         ::testing::Values(AbsorbCase{1, 16, 128, 128, 512, 576}, AbsorbCase{4, 3, 64, 96, 132, 0},
                                           AbsorbCase{2, 1, 100, 7, 512, 5}, AbsorbCase{3, 5, 128, 128, 256, 11}),
                         [](const ::testing::TestParamInfo<AbsorbCase>& info) {
                           const AbsorbCase& c = info.param;
                           return "n" + std::to_string(c.n) + "_h" + std::to_string(c.heads) + "_nope" +
                                  std::to_string(c.nope) + "_v" + std::to_string(c.vd) + "_rank" + std::to_string(c.rank);
                         });

TEST(CudaMlaAbsorbShapes, RefusesWhatTheKernelsDoNotTake) {
  EXPECT_TRUE(ck::mla_absorb_fits(1, 16, 128, 128, 512));
  EXPECT_TRUE(ck::mla_absorb_fits(ck::kMlaAbsorbMaxTokens, 16, 128, 128, 512));
  EXPECT_FALSE(ck::mla_absorb_fits(ck::kMlaAbsorbMaxTokens + 1, 16, 128, 128, 512));
  EXPECT_FALSE(ck::mla_absorb_fits(0, 16, 128, 128, 512));
  EXPECT_FALSE(ck::mla_absorb_fits(1, 0, 128, 128, 512));
  EXPECT_FALSE(ck::mla_absorb_fits(1, 65536, 128, 128, 512));
  EXPECT_FALSE(ck::mla_absorb_fits(1, 16, 129, 128, 512));
  EXPECT_FALSE(ck::mla_absorb_fits(1, 16, 128, 128, 516));
  EXPECT_FALSE(ck::mla_absorb_fits(1, 16, 128, 128, 510));
  // Refused before any launch, so no device is needed.
  EXPECT_THROW(ck::mla_absorb_uk(nullptr, 0, 192, nullptr, nullptr, 5, 16, 128, 128, 512, nullptr), std::exception);
  EXPECT_THROW(ck::mla_absorb_uv(nullptr, nullptr, nullptr, 1, 16, 128, 128, 514, nullptr), std::exception);
}

}  // namespace
}  // namespace specula
