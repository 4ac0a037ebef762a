// Admission groups (runtime/admission_groups.h): the group size against a brute-force search over
// integer groups, the fixed part of a prefill step against a float64 weighted least-squares solve
// done here, and when admission waits (rows only, never for requests not yet queued; a bounded
// number of steps; a fixed group).
#include "specula/runtime/admission_groups.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "specula/core/error.h"

namespace specula {
namespace {

TEST(AdmissionGroups, BestGroupIsTheBruteForceMinimum) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> fixed(1e-5, 2e-2), cycle(1e-4, 5e-2), lambda(0.05, 8.0);
  std::uniform_int_distribution<int> rows(1, 256);
  for (int trial = 0; trial < 2000; ++trial) {
    const double f = fixed(rng), c = cycle(rng), l = lambda(rng);
    const int r = rows(rng);
    int best = 1;
    for (int g = 2; g <= r; ++g) {
      if (AdmissionGroups::cost_per_request(g, f, c, l, r) < AdmissionGroups::cost_per_request(best, f, c, l, r)) best = g;
    }
    const int got = AdmissionGroups::best_group(f, c, l, r);
    EXPECT_NEAR(AdmissionGroups::cost_per_request(got, f, c, l, r), AdmissionGroups::cost_per_request(best, f, c, l, r),
                1e-12)
        << "fixed " << f << " cycle " << c << " lambda " << l << " rows " << r << ": " << got << " vs " << best;
  }
  // No fixed part, nothing freed yet, or one row: no group to wait for.
  EXPECT_EQ(AdmissionGroups::best_group(0.0, 1e-3, 1.0, 64), 1);
  EXPECT_EQ(AdmissionGroups::best_group(4e-3, 1e-3, 0.0, 64), 1);
  EXPECT_EQ(AdmissionGroups::best_group(4e-3, 1e-3, 1.0, 1), 1);
  // A worked example: a 4.5 ms fixed part, 1.16 ms cycles, 1.3 rows freed a cycle, 64 rows:
  // groups of about 25 = sqrt(2 x 1.3 x 64 x 4.5 / 1.16).
  EXPECT_NEAR(AdmissionGroups::best_group(4.5e-3, 1.157e-3, 1.3, 64), 25, 1);
}

TEST(AdmissionGroups, FixedPartIsTheWeightedLeastSquaresIntercept) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> a_dist(5e-4, 5e-3), b_dist(1e-7, 1e-5), noise(-2e-4, 2e-4);
  std::uniform_int_distribution<int> prompts(1, 6);
  for (int trial = 0; trial < 20; ++trial) {
    const double a = a_dist(rng), b = b_dist(rng);
    AdmissionGroups groups;
    std::vector<double> xs, ys;
    for (int i = 0; i < 60; ++i) {
      const double x = 128.0 * prompts(rng);
      const double y = a + b * x + noise(rng);
      xs.push_back(x);
      ys.push_back(y);
      groups.observe_prefill(static_cast<int64_t>(x), y);
    }
    // The reference: weights 0.95^(age), normal equations in float64.
    double w = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double wi = std::pow(0.95, static_cast<double>(xs.size() - 1 - i));
      w += wi;
      sx += wi * xs[i];
      sy += wi * ys[i];
      sxx += wi * xs[i] * xs[i];
      sxy += wi * xs[i] * ys[i];
    }
    const double slope = (w * sxy - sx * sy) / (w * sxx - sx * sx);
    const double intercept = (sy - slope * sx) / w;
    if (slope > 0 && intercept > 0) {
      EXPECT_NEAR(groups.fixed_seconds(), intercept, 1e-9 + 1e-9 * intercept);
    } else {
      EXPECT_EQ(groups.fixed_seconds(), 0.0);
    }
  }
  // Without noise the line is recovered exactly.
  AdmissionGroups exact;
  for (int x : {128, 256, 128, 384, 512, 128, 256}) exact.observe_prefill(x, 3e-3 + 2e-6 * x);
  EXPECT_NEAR(exact.fixed_seconds(), 3e-3, 1e-12);
}

TEST(AdmissionGroups, WithoutSpreadTheGroupsFallBackToOne) {
  AdmissionGroups groups;
  for (int x : {128, 256, 384, 128, 512, 256}) groups.observe_prefill(x, 2e-3 + 3e-6 * x);
  for (int i = 0; i < 20; ++i) groups.observe_decode(1e-3, 1);
  ASSERT_NEAR(groups.fixed_seconds(), 2e-3, 1e-12);
  ASSERT_GT(groups.group_size(64), 1);
  // Every step now carries four prompts: the sizes stop spreading and no intercept is identified.
  for (int i = 0; i < 200; ++i) groups.observe_prefill(512, 2e-3 + 3e-6 * 512);
  EXPECT_EQ(groups.fixed_seconds(), 0.0);
  EXPECT_EQ(groups.group_size(64), 1);
  // Spread again, on another line: identified again.
  for (int i = 0; i < 200; ++i) groups.observe_prefill(128 * (1 + i % 5), 1e-3 + 3e-6 * 128 * (1 + i % 5));
  EXPECT_NEAR(groups.fixed_seconds(), 1e-3, 1e-6);
}

TEST(AdmissionGroups, MeasuredGroupsWaitForNothingBeforeARowFrees) {
  AdmissionGroups groups;
  for (int x : {128, 256, 384, 128}) groups.observe_prefill(x, 4e-3 + 1e-7 * x);
  for (int i = 0; i < 10; ++i) groups.observe_decode(1e-3, 0);  // no row has freed yet
  EXPECT_EQ(groups.rows_freed_per_cycle(), 0.0);
  EXPECT_EQ(groups.group_size(64), 1);
  EXPECT_FALSE(groups.defer(1, 100, 63));
  EXPECT_EQ(groups.max_deferred_steps(8), 0);
}

TEST(AdmissionGroups, NoFixedPartWithoutSpreadOrWithAFallingLine) {
  AdmissionGroups same;  // every step the same size: the intercept is not identified
  for (int i = 0; i < 30; ++i) same.observe_prefill(128, 4e-3 + 1e-5 * (i % 3));
  EXPECT_EQ(same.fixed_seconds(), 0.0);
  AdmissionGroups falling;  // larger steps faster: the sizes do not explain the times
  for (int x : {128, 256, 384, 128, 256, 384}) falling.observe_prefill(x, 8e-3 - 1e-5 * x);
  EXPECT_EQ(falling.fixed_seconds(), 0.0);
  AdmissionGroups per_token;  // all work per token (a CPU): the intercept is nil, groups of 1
  for (int x : {128, 256, 384, 512, 128, 640}) per_token.observe_prefill(x, 5e-5 * x);
  for (int i = 0; i < 10; ++i) per_token.observe_decode(2e-2, 1);
  EXPECT_EQ(per_token.group_size(16), 1);
  EXPECT_FALSE(per_token.defer(1, 10, 15));
}

TEST(AdmissionGroups, WaitsOnlyForRowsAndOnlyForABoundedNumberOfSteps) {
  AdmissionGroups groups;
  for (int x : {4096, 4096, 128, 256, 128, 384, 128, 256}) groups.observe_prefill(x, 4.5e-3 + 1e-7 * x);
  for (int i = 0; i < 40; ++i) groups.observe_decode(1.2e-3, i % 3 == 0 ? 2 : 1);
  const int want = groups.group_size(64);
  ASSERT_GT(want, 4);
  EXPECT_EQ(want, AdmissionGroups::best_group(groups.fixed_seconds(), groups.cycle_seconds(),
                                              groups.rows_freed_per_cycle(), 64));
  EXPECT_FALSE(groups.defer(want, 100, 64 - want));  // a group is free: admit
  EXPECT_FALSE(groups.defer(2, 2, 62));              // the queue, not the rows, is the limit
  EXPECT_FALSE(groups.defer(2, 1, 62));
  EXPECT_FALSE(groups.defer(2, 100, 0));             // nothing decodes: admit
  // Rows are the limit: wait, at most twice the steps a group takes to free.
  const int cap = groups.max_deferred_steps(want);
  EXPECT_EQ(cap, static_cast<int>(std::ceil(2.0 * want / groups.rows_freed_per_cycle())));
  int waited = 0;
  while (waited < 1000 && groups.defer(2, 100, 62)) ++waited;
  EXPECT_EQ(waited, cap);
  // The count starts again after an admission.
  EXPECT_TRUE(groups.defer(2, 100, 62));
}

TEST(AdmissionGroups, AFixedGroupAndItsLimits) {
  AdmissionGroups three(3);
  EXPECT_EQ(three.group_size(64), 3);
  EXPECT_TRUE(three.defer(1, 10, 7));
  EXPECT_TRUE(three.defer(2, 10, 6));
  EXPECT_FALSE(three.defer(3, 10, 5));
  // Never more than the batch holds: a batch of 2 (one row decoding, one free) waits for 2.
  EXPECT_TRUE(three.defer(1, 10, 1));
  AdmissionGroups one(1);
  EXPECT_FALSE(one.defer(1, 10, 7));
  try {
    AdmissionGroups bad(-2);
    FAIL() << "a negative group was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specula
