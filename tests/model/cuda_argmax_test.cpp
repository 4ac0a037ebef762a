// argmax_rows (the GPU's greedy tokens) against the host's greedy_token on random rows: widths
// with and without a multiple of four, a Llama-3-sized vocabulary, ties, NaN, infinities and
// rows holding nothing above -inf; every row's id is written. With structured output's masks:
// the argmax over the allowed tokens only, against the host's greedy_token over the row with the
// rest set to -inf (random masks of several densities, empty masks, a mask that rules out the
// row's maximum).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/device.h"
#include "specula/model/cuda/argmax.h"
#include "specula/runner/sampler.h"

namespace specula {
namespace {

using testing::DeviceArray;

TEST(CudaArgmax, RowsMatchTheHostGreedyToken) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(1234);
  for (const int width : {1, 3, 4, 250, 1027, 4096, 128256}) {
    const int rows = width > 10000 ? 9 : 40;
    std::vector<float> x(static_cast<size_t>(rows) * width);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& v : x) v = normal(rng);
    std::uniform_int_distribution<int> col(0, width - 1);
    for (int r = 0; r < rows; ++r) {
      float* row = x.data() + static_cast<size_t>(r) * width;
      switch (r % 8) {
        case 1:  // the maximum appears several times: the lowest index wins
          for (int k = 0; k < 4; ++k) row[col(rng)] = 100.0f;
          break;
        case 2:  // NaN everywhere it lands never wins
          for (int k = 0; k < width / 3 + 1; ++k) row[col(rng)] = NAN;
          break;
        case 3:  // +inf dominates
          row[col(rng)] = INFINITY;
          row[col(rng)] = INFINITY;
          break;
        case 4:  // nothing above -inf: -1
          for (int c = 0; c < width; ++c) row[c] = c % 2 ? NAN : -INFINITY;
          break;
        case 5:  // only -inf but one finite value
          for (int c = 0; c < width; ++c) row[c] = -INFINITY;
          row[col(rng)] = -7.5f;
          break;
        default:
          break;
      }
    }
    DeviceArray<float> dx(x);
    DeviceArray<int32_t> out(static_cast<size_t>(rows));
    out.fill_bytes(0x7f);
    cuda_kernels::argmax_rows(dx.get(), rows, width, out.get(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = out.download();
    for (int r = 0; r < rows; ++r) {
      const int32_t want = greedy_token({x.data() + static_cast<size_t>(r) * width, static_cast<size_t>(width)});
      EXPECT_EQ(got[static_cast<size_t>(r)], want) << "width " << width << " row " << r;
      if (r % 8 == 4) {
        EXPECT_EQ(want, -1);
      }
    }
  }
}

TEST(CudaArgmax, MaskedRowsMatchTheHostGreedyTokenOverTheAllowedTokens) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(4321);
  for (const int width : {1, 33, 250, 4096, 128256}) {
    const int rows = width > 10000 ? 8 : 24;
    const int words = (width + 31) / 32;
    std::vector<float> x(static_cast<size_t>(rows) * width);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& v : x) v = normal(rng);
    std::vector<uint32_t> allowed(static_cast<size_t>(rows) * words);
    for (int r = 0; r < rows; ++r) {
      const float density = std::array<float, 4>{0.001f, 0.05f, 0.5f, 1.0f}[static_cast<size_t>(r % 4)];
      std::bernoulli_distribution keep(density);
      uint32_t* m = allowed.data() + static_cast<size_t>(r) * words;
      for (int c = 0; c < width; ++c) {
        if (keep(rng)) m[c / 32] |= 1u << (c % 32);
      }
      float* row = x.data() + static_cast<size_t>(r) * width;
      if (r % 6 == 5) std::fill(m, m + words, 0u);  // nothing allowed: -1
      if (r % 6 == 4) {  // the row's maximum is ruled out
        const int32_t best = greedy_token({row, static_cast<size_t>(width)});
        m[best / 32] &= ~(1u << (best % 32));
      }
      if (r % 6 == 3) {  // a tie among allowed tokens: the lowest index
        for (int c = 0; c < width; ++c) {
          if (m[c / 32] >> (c % 32) & 1u) row[c] = 50.0f;
        }
      }
    }
    DeviceArray<float> dx(x);
    DeviceArray<uint32_t> dm(allowed);
    DeviceArray<int32_t> out(static_cast<size_t>(rows));
    out.fill_bytes(0x7f);
    cuda_kernels::argmax_rows(dx.get(), rows, width, out.get(), nullptr, dm.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = out.download();
    for (int r = 0; r < rows; ++r) {
      std::vector<float> masked(x.begin() + static_cast<int64_t>(r) * width, x.begin() + static_cast<int64_t>(r + 1) * width);
      const uint32_t* m = allowed.data() + static_cast<size_t>(r) * words;
      for (int c = 0; c < width; ++c) {
        if ((m[c / 32] >> (c % 32) & 1u) == 0) masked[static_cast<size_t>(c)] = -INFINITY;
      }
      EXPECT_EQ(got[static_cast<size_t>(r)], greedy_token(masked)) << "width " << width << " row " << r;
      if (r % 6 == 5) {
        EXPECT_EQ(got[static_cast<size_t>(r)], -1);
      }
    }
  }
}

}  // namespace
}  // namespace specula
