// Rope frequencies for each scaling type, against the formulas written out here in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "specula/model/rope.h"

namespace specula {
namespace {

ModelConfig base_config(int head_dim, double theta) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.max_position_embeddings = 4096;
  return c;
}

double plain(double theta, int i, int d) { return std::pow(theta, -2.0 * i / d); }

TEST(Rope, DefaultAndLinear) {
  ModelConfig c = base_config(64, 10000.0);
  auto r = compute_rope_frequencies(c);
  ASSERT_EQ(r.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], plain(1e4, i, 64), 1e-6 * plain(1e4, i, 64));
  c.rope_scaling.type = "linear";
  c.rope_scaling.factor = 4.0;
  r = compute_rope_frequencies(c);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], plain(1e4, i, 64) / 4, 1e-6 * plain(1e4, i, 64));
  EXPECT_EQ(r.attention_factor, 1.0f);
}

TEST(Rope, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  ModelConfig c = base_config(128, 500000.0);
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
  const auto r = compute_rope_frequencies(c);
  int kept = 0, scaled = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = plain(5e5, i, 128), wavelen = 2 * M_PI / f;
    double want = f;
    if (wavelen > 8192.0) {
      want = f / 8;
      ++scaled;
    } else if (wavelen >= 2048.0) {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1 - smooth) * f / 8 + smooth * f;
      ++blended;
    } else {
      ++kept;
    }
    EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], want, 1e-5 * want) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(blended, 0);
}

TEST(Rope, DynamicNtkRaisesTheBase) {
  ModelConfig c = base_config(64, 10000.0);
  c.rope_scaling.type = "dynamic";
  c.rope_scaling.factor = 2.0;
  const auto r = compute_rope_frequencies(c);
  const double base = 10000.0 * std::pow(2.0 * 2.0 - 1.0, 64.0 / 62.0);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], plain(base, i, 64), 1e-5 * plain(base, i, 64));
}

TEST(Rope, YarnRampsBetweenExtrapolationAndInterpolation) {
  ModelConfig c = base_config(128, 10000.0);
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 1.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  auto r = compute_rope_frequencies(c);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], plain(1e4, i, 128), 1e-5 * plain(1e4, i, 128));
  EXPECT_FLOAT_EQ(r.attention_factor, 1.0f);
  // factor 4: dims below floor(correction_dim(32)) = 20 keep their frequency, dims from
  // ceil(correction_dim(1)) = 46 on are divided by 4; mscale 0.1 ln 4 + 1.
  c.rope_scaling.factor = 4.0;
  r = compute_rope_frequencies(c);
  for (int i = 0; i < 20; ++i) EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], plain(1e4, i, 128), 1e-5 * plain(1e4, i, 128));
  for (int i = 46; i < 64; ++i) EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], plain(1e4, i, 128) / 4, 1e-5 * plain(1e4, i, 128));
  const double ramp = (30.0 - 20.0) / (46.0 - 20.0);
  EXPECT_NEAR(r.inv_freq[30], plain(1e4, 30, 128) * (1 - ramp) + plain(1e4, 30, 128) / 4 * ramp, 1e-5 * plain(1e4, 30, 128));
  EXPECT_NEAR(r.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-6);
}

TEST(Rope, YarnWithDeepseekMscalesAndNoTruncation) {
  ModelConfig c = base_config(64, 10000.0);
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 40.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 0.8;
  c.rope_scaling.truncate = false;
  const auto r = compute_rope_frequencies(c);
  // cos/sin carry get_mscale(40, 1) / get_mscale(40, 0.8); the softmax scale takes the rest.
  EXPECT_NEAR(r.attention_factor, (0.1 * std::log(40.0) + 1.0) / (0.08 * std::log(40.0) + 1.0), 1e-6);
  auto dim_of = [](double rotations) { return 64.0 * std::log(4096.0 / (rotations * 2 * M_PI)) / (2 * std::log(1e4)); };
  const double low = dim_of(32.0), high = dim_of(1.0);  // unrounded without truncation
  for (int i = 0; i < 32; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = plain(1e4, i, 64) * (1 - ramp) + plain(1e4, i, 64) / 40.0 * ramp;
    EXPECT_NEAR(r.inv_freq[static_cast<size_t>(i)], want, 1e-5 * want) << i;
  }
}

}  // namespace
}  // namespace specula
