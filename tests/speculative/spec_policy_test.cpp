// SpecPolicy with cost models injected by the test: it must pick the shape with the most expected
// tokens per second (computed here independently from the per-depth rates), "off" when nothing
// beats a plain step, measure every shape of a batch size before trusting estimates, and explore
// the runner-up now and then. DepthAcceptance against a direct computation of the expected run.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "specula/core/error.h"
#include "specula/speculative/spec_policy.h"

namespace specula {
namespace {

// Expected committed tokens of a chain of `depth` drafts whose depth-d token is accepted with
// probability p[d - 1] when its parent was: 1 + sum_d prod_{j <= d} p[j - 1].
double expected(const std::vector<double>& p, int depth) {
  double total = 1, reach = 1;
  for (int d = 1; d <= depth; ++d) {
    reach *= p[static_cast<size_t>(std::min<int>(d, static_cast<int>(p.size())) - 1)];
    total += reach;
  }
  return total;
}

// A DepthAcceptance driven to per-depth rates close to p by many simulated cycles.
DepthAcceptance trained(const std::vector<double>& p, int depth, std::mt19937& rng) {
  DepthAcceptance a;
  std::uniform_real_distribution<double> u(0, 1);
  for (int cycle = 0; cycle < 4000; ++cycle) {
    int accepted = 0;
    while (accepted < depth && u(rng) < p[static_cast<size_t>(accepted)]) ++accepted;
    a.observe(depth, accepted);
  }
  return a;
}

TEST(SpecPolicy, ShapesOfEachPolicy) {
  EXPECT_EQ(policy_shapes({7, 1, 8}, SpecPolicyKind::FIXED), (std::vector<SpecShape>{{7, 8}}));
  const std::vector<SpecShape> chains = policy_shapes({4, 1, 5}, SpecPolicyKind::AUTO);
  EXPECT_EQ(chains, (std::vector<SpecShape>{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}}));
  EXPECT_TRUE(chains[0].off());
  EXPECT_EQ(policy_shapes({5, 4, 8}, SpecPolicyKind::AUTO), (std::vector<SpecShape>{{0, 1}, {5, 8}}));
  EXPECT_EQ(parse_spec_policy("AUTO"), SpecPolicyKind::AUTO);
  EXPECT_EQ(parse_spec_policy("fixed"), SpecPolicyKind::FIXED);
  try {
    parse_spec_policy("greedy");
    FAIL() << "accepted an unknown policy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'greedy'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fixed or auto"), std::string::npos) << e.what();
  }
}

TEST(SpecPolicy, DepthAcceptanceLearnsTheRatesAndTheExpectedRun) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0.5, 0.95), coin(0, 1);
  const std::vector<double> p = {u(rng), u(rng), u(rng), u(rng), u(rng)};
  // One exponential average (weight 0.1) wanders about its rate by ~0.1; its mean over many
  // cycles settles on it.
  DepthAcceptance a;
  std::vector<double> mean(5, 0.0);
  constexpr int kCycles = 20000;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    int accepted = 0;
    while (accepted < 5 && coin(rng) < p[static_cast<size_t>(accepted)]) ++accepted;
    a.observe(5, accepted);
    if (cycle >= kCycles / 2) {
      for (int d = 1; d <= 5; ++d) mean[static_cast<size_t>(d - 1)] += a.rate(d) / (kCycles / 2);
    }
  }
  for (int d = 1; d <= 5; ++d) EXPECT_NEAR(mean[static_cast<size_t>(d - 1)], p[static_cast<size_t>(d - 1)], 0.05) << "depth " << d;
  for (int depth = 0; depth <= 5; ++depth) {
    std::vector<double> r;
    for (int d = 1; d <= 5; ++d) r.push_back(a.rate(d));
    EXPECT_NEAR(a.expected_tokens(depth), expected(r, depth), 1e-12);
  }
  EXPECT_EQ(a.expected_tokens(0), 1.0);
  // Unseen depths take the deepest rate known.
  EXPECT_EQ(a.rate(9), a.rate(5));
  DepthAcceptance fresh;
  EXPECT_EQ(fresh.rate(1), DepthAcceptance::kPrior);
  fresh.seed(a);
  EXPECT_EQ(fresh.rate(3), a.rate(3));
  // Drifting toward another estimate closes kAlpha of the gap at every depth.
  DepthAcceptance poor;
  for (int i = 0; i < 100; ++i) poor.observe(5, 0);
  const double before = poor.rate(2);
  poor.drift_to(a);
  EXPECT_NEAR(poor.rate(2), before + DepthAcceptance::kAlpha * (a.rate(2) - before), 1e-12);
  for (int i = 0; i < 300; ++i) poor.drift_to(a);
  EXPECT_NEAR(poor.expected_tokens(5), a.expected_tokens(5), 1e-6);
}

// The engine-wide estimate (weight 0.01) stays near the true rates where a request's (weight 0.1)
// wanders with the last few cycles: over the same random cycles, its largest distance from the
// rate is a fraction of the request estimate's.
TEST(SpecPolicy, EngineWideAcceptanceAveragesOverManyCycles) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> coin(0, 1);
  const double p = std::uniform_real_distribution<double>(0.6, 0.9)(rng);
  DepthAcceptance request, engine(DepthAcceptance::kEngineAlpha);
  double worst_request = 0, worst_engine = 0;
  for (int cycle = 0; cycle < 20000; ++cycle) {
    int accepted = 0;
    while (accepted < 4 && coin(rng) < p) ++accepted;
    request.observe(4, accepted);
    engine.observe(4, accepted);
    if (cycle >= 2000) {
      worst_request = std::max(worst_request, std::abs(request.rate(1) - p));
      worst_engine = std::max(worst_engine, std::abs(engine.rate(1) - p));
    }
  }
  // A 10-cycle average of Bernoulli(p) moves by about 0.3 at its extremes over 18,000 cycles; a
  // 100-cycle one by about a third of that.
  EXPECT_GT(worst_request, 0.15);
  EXPECT_LT(worst_engine, 0.6 * worst_request);
  EXPECT_LT(worst_engine, 0.18);
  // A request seeded from the engine starts at its rates and keeps its own weight.
  DepthAcceptance seeded;
  seeded.seed(engine);
  EXPECT_EQ(seeded.rate(2), engine.rate(2));
  const double before = seeded.rate(1);
  seeded.observe(4, 0);
  EXPECT_NEAR(seeded.rate(1), before * (1 - DepthAcceptance::kAlpha), 1e-12);
  // The policy's engine-wide estimate, which the scheduler feeds every cycle, takes the slow weight.
  SpecPolicy policy(SpecPolicyKind::AUTO, SpecParams{4, 1, 5});
  const double start = policy.acceptance().rate(1);
  policy.acceptance().observe(4, 0);
  EXPECT_NEAR(policy.acceptance().rate(1), start * (1 - DepthAcceptance::kEngineAlpha), 1e-12);
}

// While short chains run, the depths past them move toward the chain's last depth, so that a dip
// which made the policy shorten its chains does not keep the deeper estimates (and the policy)
// low for good; a full-length chain leaves nothing to move.
TEST(SpecPolicy, DepthsPastAShortChainFollowItsLastDepth) {
  DepthAcceptance a;
  for (int i = 0; i < 200; ++i) a.observe(6, 2);  // depths 1-2 accepted, depth 3 rejected
  ASSERT_GT(a.rate(2), 0.99);
  ASSERT_LT(a.rate(3), 0.01);
  ASSERT_LT(a.expected_tokens(6), 3.05);
  for (int i = 0; i < 40; ++i) a.observe(2, 2);  // chains of two, both accepted
  // Depth 3 closed kAlpha of its gap to depth 2 at each cycle: 1 - 0.9^40 of it.
  EXPECT_NEAR(a.rate(3), 1 - std::pow(1 - DepthAcceptance::kAlpha, 40), 0.02);
  EXPECT_GT(a.expected_tokens(6), 6.0);
  // A chain as long as every depth known moves nothing past it.
  DepthAcceptance full;
  for (int i = 0; i < 50; ++i) full.observe(4, 4);
  const double r3 = full.rate(3), r1 = full.rate(1);
  full.observe(4, 0);
  EXPECT_EQ(full.rate(3), r3);
  EXPECT_LT(full.rate(1), r1);
}

// Speculation turned back on first catches the draft up on the tokens its requests ran without
// it. Once a catch-up has been measured, the policy prices it in: a drafting shape pays a lagging
// request's catch-up spread over the cycles the request has left, and, where drafting is expected
// to resume (the engine-wide acceptance favours a drafting shape), "off" pays the catch-up it
// defers (one more missed pair per request with tokens left). So a request with many tokens left
// turns speculation back on however long it lagged, a nearly finished one stays off, and a dip
// in one request's acceptance that barely favours "off" does not turn speculation off unless the
// request is on its last token; where the whole engine accepts as poorly, off defers nothing.
TEST(SpecPolicy, CatchUpIsPricedIntoTheRates) {
  const SpecParams max{4, 1, 5};
  // Off: 1 token per ms; (4, 5): 3 ms a cycle; shorter chains 10 ms a cycle.
  auto make = [&] {
    SpecPolicy policy(SpecPolicyKind::AUTO, max);
    for (const SpecShape& s : policy.shapes()) policy.costs().set_prior(1, s, s.off() ? 1e-3 : s.num_steps == 4 ? 3e-3 : 1e-2);
    return policy;
  };
  DepthAcceptance full;  // every depth accepted: 5 tokens a (4, 5) cycle
  for (int i = 0; i < 300; ++i) full.observe(4, 4);
  ASSERT_NEAR(full.expected_tokens(4), 5.0, 1e-6);
  DepthAcceptance dipped;  // depth 1 accepted, depth 2 not: 2 tokens a cycle, 0.67 per ms
  for (int i = 0; i < 300; ++i) dipped.observe(4, 1);
  ASSERT_NEAR(dipped.expected_tokens(4), 2.0, 1e-6);
  const std::vector<const DepthAcceptance*> good(1, &full), poor(1, &dipped);

  // No catch-up measured yet: lags change nothing, and the dip turns speculation off.
  SpecPolicy unpriced = make();
  EXPECT_EQ(unpriced.choose(good, {{24, 1000}}).shape, (SpecShape{4, 5}));
  EXPECT_TRUE(make().choose(poor, {{0, 1000}}).shape.off());
  ASSERT_FALSE(unpriced.costs().catch_up_per_token(1).has_value());

  // The engine as a whole accepts every depth: drafting is expected to resume after a dip.
  auto priced = [&] {
    SpecPolicy policy = make();
    policy.costs().observe_catch_up(1, 10, 10e-3);  // 1 ms per missed token
    policy.acceptance().seed(full);
    return policy;
  };
  ASSERT_NEAR(*priced().costs().catch_up_per_token(1), 1e-3, 1e-12);
  // 24 missed, 1000 tokens left (200 cycles): 0.12 ms a cycle, 5 / 3.12 per ms beats off's
  // 1 / (1 + 1).
  EXPECT_EQ(priced().choose(good, {{24, 1000}}).shape, (SpecShape{4, 5}));
  // 24 missed, 10 tokens left (2 cycles): 12 ms a cycle, 5 / 15 per ms loses to off's 0.5.
  EXPECT_TRUE(priced().choose(good, {{24, 10}}).shape.off());
  // The dip: 2 / 3 per ms against off's 1 / (1 + 1): speculation stays on; on the request's last
  // token off defers nothing and wins.
  EXPECT_EQ(priced().choose(poor, {{0, 1000}}).shape, (SpecShape{4, 5}));
  EXPECT_TRUE(priced().choose(poor, {{0, 1}}).shape.off());
  // Where the engine as a whole accepts as poorly, off runs on fastest: drafting is not expected
  // to resume, off defers nothing, and the request goes off (1 per ms against 2 / 3).
  SpecPolicy poor_engine = priced();
  poor_engine.acceptance().seed(dipped);
  EXPECT_TRUE(poor_engine.choose(poor, {{0, 1000}}).shape.off());
  // Its lag is still priced into drafting: back on only where the request's own estimate pays
  // for the catch-up (24 missed over 200 cycles: 5 / 3.12 per ms).
  EXPECT_EQ(poor_engine.choose(good, {{24, 1000}}).shape, (SpecShape{4, 5}));
  // Each request of a batch pays its own lag: a long lagging one beside one on time.
  SpecPolicy pair = priced();
  for (const SpecShape& s : pair.shapes()) pair.costs().set_prior(2, s, s.off() ? 1e-3 : s.num_steps == 4 ? 3e-3 : 1e-2);
  pair.costs().observe_catch_up(2, 10, 10e-3);
  const std::vector<const DepthAcceptance*> both{&full, &full};
  // Off: 2 tokens / (1 + 2) ms; (4, 5): 10 tokens / (3 + 400 x 1 / max(1, 4 / 5)) ms.
  EXPECT_TRUE(pair.choose(both, {{400, 4}, {0, 1000}}).shape.off());
  // The per-token estimate is the ratio of exponential averages of the catch-ups' seconds and
  // tokens: a small catch-up (mostly fixed cost) moves it by its share of the tokens, not by its
  // own per-token figure.
  SpecPolicy averaged = priced();
  averaged.costs().observe_catch_up(1, 4, 8e-3);
  const double a = SpecCostModel::kAlpha;
  EXPECT_NEAR(*averaged.costs().catch_up_per_token(1), (10e-3 + a * (8e-3 - 10e-3)) / (10 + a * (4 - 10)), 1e-12);
  try {
    priced().choose(both, {{1, 1}});
    FAIL() << "accepted one lag for two requests";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("1 lags for 2 requests"), std::string::npos) << e.what();
  }
}

TEST(SpecPolicy, PicksTheMostTokensPerSecondIncludingOff) {
  std::mt19937 rng(std::random_device{}());
  const SpecParams max{6, 1, 7};
  const std::vector<double> p = {0.9, 0.8, 0.7, 0.6, 0.5, 0.4};
  const DepthAcceptance a = trained(p, 6, rng);
  std::vector<double> r;
  for (int d = 1; d <= 6; ++d) r.push_back(a.rate(d));
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  for (int trial = 0; trial < 50; ++trial) {
    SpecPolicy policy(SpecPolicyKind::AUTO, max, {1, 8, 32});
    // A cycle: a fixed part, a part per draft step and a part per verified token, random per
    // trial so that sometimes long chains, sometimes short ones and sometimes off win.
    const double fixed = 1e-4 * jitter(rng), per_step = 3e-5 * jitter(rng) * (trial % 5), per_token = 2e-5 * jitter(rng) * (trial % 7);
    const int bs = 1 + static_cast<int>(rng() % 32);
    double best_rate = 0;
    SpecShape best;
    for (const SpecShape& s : policy.shapes()) {
      const double seconds = fixed + per_step * s.num_steps + per_token * s.num_draft_tokens * bs;
      policy.costs().set_prior(bs, s, seconds);
      const double rate = bs * expected(r, s.num_steps) / seconds;
      if (rate > best_rate) best_rate = rate, best = s;
    }
    const std::vector<const DepthAcceptance*> batch(static_cast<size_t>(bs), &a);
    const SpecChoice c = policy.choose(batch);
    EXPECT_EQ(c.shape, best) << "trial " << trial << ": chose " << c.shape.str() << " (" << c.why << ")";
    EXPECT_NEAR(c.tokens_per_s, best_rate, 1e-6 * best_rate);
    EXPECT_FALSE(c.explored);
  }
}

TEST(SpecPolicy, OffWhenEveryDraftLosesAndTheLongestChainWhenDraftsAreFree) {
  const SpecParams max{4, 1, 5};
  DepthAcceptance good;
  for (int i = 0; i < 200; ++i) good.observe(4, 4);  // every draft accepted
  const std::vector<const DepthAcceptance*> batch(8, &good);
  SpecPolicy slow(SpecPolicyKind::AUTO, max);
  for (const SpecShape& s : slow.shapes()) slow.costs().set_prior(8, s, s.off() ? 1.0 : 6.0 * s.num_draft_tokens);
  EXPECT_TRUE(slow.choose(batch).shape.off());
  SpecPolicy free(SpecPolicyKind::AUTO, max);
  for (const SpecShape& s : free.shapes()) free.costs().set_prior(8, s, 1.0);
  EXPECT_EQ(free.choose(batch).shape, (SpecShape{4, 5}));
  // A request that never gets a draft token accepted: off, even with cheap drafts.
  DepthAcceptance bad;
  for (int i = 0; i < 200; ++i) bad.observe(4, 0);
  const std::vector<const DepthAcceptance*> poor(8, &bad);
  for (const SpecShape& s : free.shapes()) free.costs().set_prior(8, s, 1.0 + 0.05 * s.num_steps);
  EXPECT_TRUE(free.choose(poor).shape.off());
}

TEST(SpecPolicy, MeasuresEveryShapeFirstThenExploresTheRunnerUp) {
  const SpecParams max{3, 1, 4};
  SpecPolicy policy(SpecPolicyKind::AUTO, max, {4});
  DepthAcceptance a;
  const std::vector<const DepthAcceptance*> batch(3, &a);
  // No estimate at all: the shapes are tried from the largest down, each once.
  std::vector<SpecShape> tried;
  for (size_t i = 0; i < policy.shapes().size(); ++i) {
    const SpecChoice c = policy.choose(batch);
    EXPECT_TRUE(c.explored);
    tried.push_back(c.shape);
    // Measured: longer chains cost more, off is cheapest per cycle but (1, 2) wins.
    policy.observe(3, c.shape, c.shape.off() ? 1.0 : 1.2 + 0.5 * (c.shape.num_steps - 1));
  }
  EXPECT_EQ(tried, (std::vector<SpecShape>{{3, 4}, {2, 3}, {1, 2}, {0, 1}}));
  EXPECT_EQ(policy.costs().measured(3, {1, 2}), 1);
  EXPECT_EQ(policy.costs().bucket(3), 4);
  // Rates: off 3/1.0 = 3.0; (1,2) 3 x 1.7 / 1.2 = 4.25; (2,3) 3 x 2.19 / 1.7 = 3.86; (3,4) 3 x 2.53 / 2.2 = 3.45.
  int explored = 0;
  for (int i = 1; i <= 2 * SpecPolicy::kExploreEvery; ++i) {
    const SpecChoice c = policy.choose(batch);
    if (c.explored) {
      ++explored;
      EXPECT_EQ(c.shape, (SpecShape{2, 3})) << c.why;
    } else {
      EXPECT_EQ(c.shape, (SpecShape{1, 2})) << c.why;
    }
  }
  EXPECT_EQ(explored, 2);
  // Once measured, a prior no longer counts; later measurements move by the average's weight, and
  // a step that did not run (0 s) is ignored.
  policy.costs().set_prior(3, {1, 2}, 9.0);
  EXPECT_DOUBLE_EQ(*policy.costs().seconds(3, {1, 2}), 1.2);
  policy.observe(3, {1, 2}, 2.2);
  EXPECT_DOUBLE_EQ(*policy.costs().seconds(3, {1, 2}), 1.2 + SpecCostModel::kAlpha * 1.0);
  policy.observe(3, {1, 2}, 0.0);
  EXPECT_DOUBLE_EQ(*policy.costs().seconds(3, {1, 2}), 1.2 + SpecCostModel::kAlpha * 1.0);
  // A first measurement meets an existing prior halfway.
  SpecCostModel costs({8});
  costs.set_prior(5, {2, 3}, 4.0);
  costs.observe(6, {2, 3}, 2.0);
  EXPECT_DOUBLE_EQ(*costs.seconds(8, {2, 3}), 3.0);
  EXPECT_EQ(costs.measured(7, {2, 3}), 1);
}

// An off bucket explores its drafting runner-up only when the batch is caught up (at most a
// missed token a request), since the exploration first catches the draft up on every missed
// token; once due it waits, up to kExploreLate choices. A drafting bucket explores on time.
TEST(SpecPolicy, ExploringFromOffWaitsForACaughtUpBatch) {
  const SpecParams max{2, 1, 3};
  SpecPolicy policy(SpecPolicyKind::AUTO, max, {2});
  // Off 1 token per ms a request; (1, 2) and (2, 3) lose at the prior acceptance (0.7 a depth).
  for (const SpecShape& s : policy.shapes()) policy.costs().set_prior(2, s, s.off() ? 1e-3 : 3e-3 * s.num_steps);
  policy.costs().observe_catch_up(2, 10, 1e-3);
  DepthAcceptance a;
  const std::vector<const DepthAcceptance*> batch(2, &a);
  const std::vector<SpecLag> lagging{{40, 500}, {3, 500}}, caught_up{{1, 500}, {0, 500}};
  // Lagging: no exploration before kExploreLate choices, then one of two cycles.
  int first = 0;
  for (int i = 1; i <= SpecPolicy::kExploreLate; ++i) {
    const SpecChoice c = policy.choose(batch, lagging);
    if (c.explored) {
      first = i;
      break;
    }
    EXPECT_TRUE(c.shape.off()) << c.why;
  }
  EXPECT_EQ(first, SpecPolicy::kExploreLate);
  EXPECT_FALSE(policy.choose(batch, lagging).shape.off());  // the exploration's second cycle
  // Caught up: due kExploreEvery choices after the last, and taken then.
  for (int i = 1; i < SpecPolicy::kExploreEvery; ++i) EXPECT_FALSE(policy.choose(batch, caught_up).explored) << i;
  const SpecChoice due = policy.choose(batch, caught_up);
  EXPECT_TRUE(due.explored);
  EXPECT_FALSE(due.shape.off());
}

TEST(SpecPolicy, FixedAlwaysRunsTheConfiguredShapeAndForcedSequencesRotate) {
  SpecPolicy fixed(SpecPolicyKind::FIXED, {5, 4, 8});
  DepthAcceptance a;
  const std::vector<const DepthAcceptance*> batch(2, &a);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fixed.choose(batch).shape, (SpecShape{5, 8}));
  SpecPolicy policy(SpecPolicyKind::AUTO, {3, 1, 4});
  policy.force_sequence({{0, 1}, {3, 4}, {1, 2}});
  EXPECT_EQ(policy.choose(batch).shape, (SpecShape{0, 1}));
  EXPECT_EQ(policy.choose(batch).shape, (SpecShape{3, 4}));
  EXPECT_EQ(policy.choose(batch).shape, (SpecShape{1, 2}));
  EXPECT_EQ(policy.choose(batch).shape, (SpecShape{0, 1}));
  EXPECT_THROW(policy.force_sequence({{5, 6}}), Error);
}

}  // namespace
}  // namespace specula
