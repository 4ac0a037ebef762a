// Sampler: greedy is argmax; a seed makes sampling reproducible; top-k / top-p / min-p restrict
// the support; temperature sampling follows the softmax (frequency check); bad values are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/grammar/json_grammar.h"
#include "specula/grammar/token_constraint.h"
#include "specula/runner/sampler.h"
#include "specula/runner/softmax_weights.h"

namespace specula {
namespace {

TEST(Sampler, GreedyAndFilters) {
  const std::vector<float> logits{0.1f, 2.5f, -1.0f, 2.4f, 0.0f};
  EXPECT_EQ(Sampler(SamplingParams{}).sample(logits), 1);
  SamplingParams top1{1.0f, 1, 1.0f, 0.0f, 7};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Sampler(top1).sample(logits), 1);
  SamplingParams nucleus{1.0f, 0, 0.3f, 0.0f, 7};  // the top token alone has p > 0.3
  Sampler s(nucleus);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits), 1);
  SamplingParams top2{1.0f, 2, 1.0f, 0.0f, 9};
  Sampler s2(top2);
  for (int i = 0; i < 200; ++i) {
    const int t = s2.sample(logits);
    EXPECT_TRUE(t == 1 || t == 3);
  }
  SamplingParams minp{1.0f, 0, 1.0f, 0.5f, 3};  // keeps tokens with p >= 0.5 * p_max: ids 1 and 3
  Sampler s3(minp);
  for (int i = 0; i < 200; ++i) {
    const int t = s3.sample(logits);
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

// The filters select without sorting the whole vocabulary (a selection for top-k, a prefix sorted
// in growing steps for top-p and min-p): against a float64 reference that sorts everything, on
// vocabularies large enough for several steps, with tied logits and -inf entries.
std::vector<double> reference_distribution(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  while (keep > 0 && std::isinf(logits[static_cast<size_t>(order[keep - 1])])) --keep;
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  std::vector<double> probs(keep);
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += probs[i] = std::exp((double{logits[order[i]]} - logits[order[0]]) / p.temperature);
  for (double& x : probs) x /= z;
  size_t cut = keep;
  double cumulative = 0;
  for (size_t i = 0; i < keep && p.top_p < 1.0f; ++i) {
    cumulative += probs[i];
    if (cumulative >= p.top_p) {
      cut = i + 1;
      break;
    }
  }
  for (size_t i = 1; i < cut && p.min_p > 0.0f; ++i) {
    if (probs[i] < probs[0] * p.min_p) cut = i;
  }
  double kept = 0;
  for (size_t i = 0; i < cut; ++i) kept += probs[i];
  std::vector<double> out(logits.size(), 0.0);
  for (size_t i = 0; i < cut; ++i) out[static_cast<size_t>(order[i])] = probs[i] / kept;
  return out;
}

TEST(Sampler, DistributionMatchesANaiveReferenceOnALargeVocabulary) {
  std::mt19937 rng(20261129);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t vocab = trial % 3 == 0 ? 50000 : 3000;
    std::normal_distribution<float> normal(0.0f, trial % 2 ? 1.0f : 4.0f);
    std::vector<float> logits(vocab);
    for (float& x : logits) x = std::round(normal(rng) * 8.0f) / 8.0f;  // many ties
    for (size_t i = 0; i < vocab; i += 7) logits[i] = -INFINITY;
    SamplingParams p;
    p.temperature = std::array<float, 3>{0.3f, 0.7f, 1.5f}[static_cast<size_t>(trial % 3)];
    p.top_k = std::array<int, 4>{0, 1, 40, 2500}[static_cast<size_t>(trial % 4)];
    p.top_p = std::array<float, 5>{1.0f, 0.9f, 0.5f, 0.99f, 0.2f}[static_cast<size_t>(trial % 5)];
    p.min_p = std::array<float, 3>{0.0f, 0.05f, 0.001f}[static_cast<size_t>(trial % 7 % 3)];
    Sampler s(p);
    std::vector<float> got;
    s.distribution(logits, got);
    const std::vector<double> want = reference_distribution(logits, p);
    size_t support = 0;
    for (size_t i = 0; i < vocab; ++i) {
      support += want[i] > 0;
      ASSERT_EQ(got[i] > 0.0f, static_cast<float>(want[i]) > 0.0f) << "trial " << trial << " token " << i;
      ASSERT_NEAR(got[i], want[i], 1e-6 + 1e-5 * want[i]) << "trial " << trial << " token " << i;
    }
    EXPECT_GE(support, 1u);
  }
}

TEST(Sampler, SeededAndFollowsTheSoftmax) {
  const std::vector<float> logits{1.0f, 0.0f, -1.0f, 0.5f};
  SamplingParams p{0.7f, 0, 1.0f, 0.0f, 1234};
  Sampler a(p), b(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
  std::vector<double> expected(4);
  double z = 0;
  for (size_t i = 0; i < 4; ++i) z += expected[i] = std::exp(logits[i] / 0.7);
  std::vector<int> counts(4, 0);
  const int n = 40000;
  Sampler c(p);
  for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(c.sample(logits))];
  for (size_t i = 0; i < 4; ++i) {
    const double pi = expected[i] / z;
    EXPECT_NEAR(counts[i] / static_cast<double>(n), pi, 4 * std::sqrt(pi * (1 - pi) / n)) << "token " << i;
  }
}

TEST(Sampler, FollowsTheSoftmaxAcrossALargeVocabulary) {
  // 5,000 tokens (the draw searches blocks of 1,024 weights first): five heavy tokens spread over
  // the blocks, one masked out, and a light random rest, whose share is checked block by block.
  const int vocab = 5000;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> light(-4.0f, -2.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = light(rng);
  const std::vector<int> heavy = {3, 1023, 1024, 2500, 4999};
  for (size_t i = 0; i < heavy.size(); ++i) logits[static_cast<size_t>(heavy[i])] = 1.0f + 0.3f * static_cast<float>(i);
  logits[4000] = -INFINITY;
  const float t = 0.8f;
  std::vector<double> p(vocab);
  double z = 0;
  for (int i = 0; i < vocab; ++i) z += p[static_cast<size_t>(i)] = std::exp(static_cast<double>(logits[static_cast<size_t>(i)]) / t);
  // Bins: each heavy token, then the light tokens of each block of 1,024.
  auto bin_of = [&](int id) {
    const auto it = std::find(heavy.begin(), heavy.end(), id);
    return it != heavy.end() ? static_cast<int>(it - heavy.begin()) : static_cast<int>(heavy.size()) + id / 1024;
  };
  const int bins = static_cast<int>(heavy.size()) + (vocab + 1023) / 1024;
  std::vector<double> expected(static_cast<size_t>(bins), 0.0);
  for (int i = 0; i < vocab; ++i) expected[static_cast<size_t>(bin_of(i))] += p[static_cast<size_t>(i)] / z;
  Sampler s(SamplingParams{t, 0, 1.0f, 0.0f, rng()});
  std::vector<int> counts(static_cast<size_t>(bins), 0);
  const int n = 60000;
  for (int i = 0; i < n; ++i) {
    const int32_t id = s.sample(logits);
    ASSERT_NE(id, 4000) << "a masked token was drawn";
    ++counts[static_cast<size_t>(bin_of(id))];
  }
  for (int b = 0; b < bins; ++b) {
    const double pb = expected[static_cast<size_t>(b)];
    EXPECT_NEAR(counts[static_cast<size_t>(b)] / static_cast<double>(n), pb, 5 * std::sqrt(pb * (1 - pb) / n) + 1e-4)
        << "bin " << b;
  }
}

TEST(Sampler, PrepareDrawCommitIsSample) {
  // The batch path (penalties and mask on one thread, draws on others) picks what sample() picks.
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.0f, 2.0f);
  SamplingParams p{0.9f, 0, 0.95f, 0.0f, rng()};
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.2f;
  Sampler a(p), b(p);
  const std::vector<int32_t> prompt = {1, 5, 9};
  a.observe_prompt(prompt);
  b.observe_prompt(prompt);
  std::vector<float> logits(3000);
  for (int step = 0; step < 60; ++step) {
    for (float& x : logits) x = dist(rng);
    const int32_t want = a.sample(logits);
    const int32_t got = b.draw(b.prepare(logits));
    b.commit(got);
    ASSERT_EQ(got, want) << "step " << step;
  }
}

// A grammar's mask filled ahead of the draw (premask, as while a GPU runs the step) gives what
// prepare() computes itself, and a token recorded after it makes prepare() compute a fresh one:
// against a sampler that never premasks, with the same seed, penalties and random logits.
TEST(Sampler, PremaskedRowsDrawWhatUnmaskedRowsDraw) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<std::string> tokens;
  for (int b = 32; b < 127; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"", "\":", "\": \"", "\", \"", "\"}", "true", "null", "12", "3.5", "}", " {", "[{", "}]",
                        "abc", "\":[", "\\n", "false,"}) {
    tokens.emplace_back(t);
  }
  tokens.emplace_back();  // the end token (no bytes)
  const auto end_id = static_cast<int32_t>(tokens.size() - 1);
  const auto vocabulary = std::make_shared<const grammar::Vocabulary>(tokens);
  const auto automaton =
      std::make_shared<const grammar::Automaton>(std::make_shared<const grammar::Grammar>(grammar::json_object_grammar()));
  const int vocab = static_cast<int>(tokens.size()) + 7;  // padding ids the vocabulary lacks
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  // Documents may end within a few tokens ("{}"): new ones until enough steps ran.
  int steps = 0, stale_checks = 0;
  for (int doc = 0; doc < 200 && (steps < 60 || stale_checks < 5); ++doc) {
    SamplingParams p{0.8f, 0, 1.0f, 0.0f, rng()};
    p.repetition_penalty = 1.2f;
    Sampler a(p), b(p);
    a.constrain(std::make_unique<grammar::TokenConstraint>(automaton, vocabulary, std::vector<int32_t>{end_id}));
    b.constrain(std::make_unique<grammar::TokenConstraint>(automaton, vocabulary, std::vector<int32_t>{end_id}));
    for (int step = 0; step < 40 && !b.grammar_terminated(); ++step, ++steps) {
      for (float& x : logits) x = dist(rng);
      a.premask(vocab);
      if (step % 3 == 1) {
        // The premask goes stale: both record the greedy allowed token first.
        const int32_t forced = b.greedy_at(logits, {});
        a.commit(forced);
        b.commit(forced);
        ++stale_checks;
        if (b.grammar_terminated()) break;
      }
      const std::span<const float> got = a.prepare(logits);
      const std::span<const float> want = b.prepare(logits);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << "document " << doc << ", step " << step << ", id " << i;
      }
      const int32_t token = b.draw(want);
      ASSERT_EQ(a.draw(got), token) << "document " << doc << ", step " << step;
      a.commit(token);
      b.commit(token);
    }
  }
  EXPECT_GE(steps, 60);
  EXPECT_GE(stale_checks, 5);
}

// The vectorised weights equal expf of every lane, those whose weight is a denormal (which the
// vector exp's fast path cannot give) included, and 0 for -inf; rows like a grammar's masked ones
// (mostly -inf) and rows spread wide enough to reach the denormals.
TEST(SoftmaxWeights, EqualExpfOfEveryLaneAndSumInDouble) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  int denormals = 0, zeros = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const size_t n = 1000 + rng() % 40000;
    const float temperature = std::array<float, 4>{0.3f, 0.7f, 1.0f, 1.6f}[static_cast<size_t>(trial % 4)];
    std::uniform_real_distribution<float> spread(-45.0f, 5.0f);
    std::vector<float> x(n);
    for (float& v : x) v = spread(rng);
    const bool masked = trial % 2 == 0;
    for (size_t i = 0; i < n; ++i) {
      if (masked ? rng() % 50 != 0 : rng() % 9 == 0) x[i] = -INFINITY;
    }
    x[rng() % n] = 6.0f;
    const float top = row_max(x);
    std::vector<float> w(n);
    std::vector<double> blocks;
    const double sum = softmax_weights(x, top, temperature, w, &blocks);
    double want_sum = 0;
    for (size_t i = 0; i < n; ++i) {
      const float want = x[i] == -INFINITY ? 0.0f : std::exp((x[i] - top) * (1.0f / temperature));
      ASSERT_NEAR(w[i], want, 1e-6 * want + 3e-45) << "trial " << trial << ", lane " << i << ", x " << x[i];
      denormals += want > 0.0f && want < 1.1754944e-38f;
      zeros += want == 0.0f;
      want_sum += want;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum);
    ASSERT_EQ(blocks.size(), (n + kSoftmaxBlock - 1) / kSoftmaxBlock);
    EXPECT_NEAR(std::accumulate(blocks.begin(), blocks.end(), 0.0), sum, 1e-9 * sum);
  }
  EXPECT_GT(denormals, 10);
  EXPECT_GT(zeros, 1000);
}

TEST(Sampler, PenaltiesFollowSglangSemantics) {
  // Greedy with a repetition penalty: token 1 (logit 2.5, in the prompt) becomes 2.5 / 2 = 1.25,
  // below token 3 (2.4).
  SamplingParams rep;
  rep.repetition_penalty = 2.0f;
  Sampler a(rep);
  a.observe_prompt(std::vector<int32_t>{1});
  const std::vector<float> logits{0.1f, 2.5f, -1.0f, 2.4f, 0.0f};
  EXPECT_EQ(a.sample(logits), 3);
  // Negative logits are multiplied: token 2 at -1.0 in the history falls to -2.0.
  SamplingParams rep2;
  rep2.repetition_penalty = 2.0f;
  Sampler b(rep2);
  b.observe_prompt(std::vector<int32_t>{0, 1, 3, 4});
  const std::vector<float> neg{-0.9f, -0.5f, -0.95f, -0.6f, -0.7f};
  EXPECT_EQ(b.sample(neg), 2) << "-0.95 is not in the history and stays; the others double below it";
  // Frequency penalty counts output occurrences only: after one token 1, 2.5 - 0.2 < 2.4.
  SamplingParams freq;
  freq.frequency_penalty = 0.2f;
  Sampler c(freq);
  c.observe_prompt(std::vector<int32_t>{3});  // prompt tokens are not penalised by frequency
  EXPECT_EQ(c.sample(logits), 1);
  EXPECT_EQ(c.sample(logits), 3);
  // Presence penalty: once, however often the token occurred.
  SamplingParams pres;
  pres.presence_penalty = 0.05f;
  Sampler d(pres);
  EXPECT_EQ(d.sample(logits), 1);
  EXPECT_EQ(d.sample(logits), 1) << "2.5 - 0.05 still beats 2.4";
}

TEST(Sampler, NonFiniteLogits) {
  const std::vector<float> with_nan{0.5f, NAN, 0.2f};
  EXPECT_EQ(Sampler(SamplingParams{}).sample(with_nan), 0);
  SamplingParams t{1.0f, 0, 1.0f, 0.0f, 5};
  Sampler s(t);
  for (int i = 0; i < 50; ++i) EXPECT_NE(s.sample(with_nan), 1) << "NaN counts as impossible";
  const std::vector<float> with_inf{0.5f, INFINITY, 0.2f};
  Sampler s2(t);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s2.sample(with_inf), 1);
  const std::vector<float> hopeless{NAN, -INFINITY};
  EXPECT_THROW(Sampler(SamplingParams{}).sample(hopeless), Error);
}

// greedy_token (one pass over raw logits, what GPU models compute on the device) agrees with a
// direct reference and with the sampling path at top_k = 1 (which cleans the logits and stably
// sorts them) on random rows with ties, NaN and infinities mixed in.
TEST(Sampler, GreedyTokenMatchesTheGreedyPick) {
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> small(0, 3);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 37;
    std::vector<float> logits(static_cast<size_t>(n));
    for (float& x : logits) {
      const int kind = std::uniform_int_distribution<int>(0, 19)(rng);
      x = kind == 0 ? NAN : kind == 1 ? -INFINITY : kind == 2 && trial % 5 == 0 ? INFINITY : 0.5f * small(rng);
    }
    if (trial % 11 == 0) std::fill(logits.begin(), logits.end(), trial % 2 ? NAN : -INFINITY);
    const int32_t token = greedy_token(logits);
    const bool hopeless = std::none_of(logits.begin(), logits.end(), [](float x) { return x > -INFINITY; });
    if (hopeless) {
      EXPECT_EQ(token, -1);
      EXPECT_THROW(Sampler(SamplingParams{}).sample(logits), Error);
      EXPECT_THROW(Sampler(SamplingParams{1.0f, 1, 1.0f, 0.0f, 3}).sample(logits), Error);
      EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, 1.0f, 0.0f, 3}).sample(logits), Error) << "no filter";
      continue;
    }
    float best = -INFINITY;
    for (float x : logits) best = std::isnan(x) ? best : std::max(best, x);
    const auto first = std::find(logits.begin(), logits.end(), best) - logits.begin();
    EXPECT_EQ(token, first) << "trial " << trial;
    EXPECT_EQ(Sampler(SamplingParams{}).sample(logits), token);
    EXPECT_EQ(Sampler(SamplingParams{1.0f, 1, 1.0f, 0.0f, 3}).sample(logits), token) << "trial " << trial;
    Sampler s(SamplingParams{});
    ASSERT_TRUE(s.picks_argmax());
    EXPECT_EQ(s.take_argmax(token), token);
  }
  EXPECT_THROW(Sampler(SamplingParams{}).take_argmax(-1), Error);
  SamplingParams penalised;
  penalised.repetition_penalty = 1.2f;
  EXPECT_FALSE(Sampler(penalised).picks_argmax());
  EXPECT_FALSE(Sampler(SamplingParams{0.7f, 0, 1.0f, 0.0f, 1}).picks_argmax());
}

TEST(Sampler, BadValuesAreNamed) {
  EXPECT_THROW(Sampler(SamplingParams{-1.0f, 0, 1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, -3, 1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, 0.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, 1.0f, 1.0f, 0}), Error);
  SamplingParams bad;
  bad.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler{bad}, Error);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// log_softmax_at against a float64 reference over fresh random logits with ties and a NaN: the
// chosen token's log-probability, and the top-N ids best first with ties to the lower id.
TEST(Logprobs, LogSoftmaxAtMatchesFloat64Reference) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> quarter(-40, 40);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(300 + trial);
    for (float& x : logits) x = static_cast<float>(quarter(rng)) / 4.0f;  // many ties
    logits[7] = std::nanf("");
    double max = -INFINITY;
    for (size_t i = 0; i < logits.size(); ++i) if (i != 7) max = std::max(max, static_cast<double>(logits[i]));
    double sum = 0;
    for (size_t i = 0; i < logits.size(); ++i) if (i != 7) sum += std::exp(static_cast<double>(logits[i]) - max);
    const double lse = max + std::log(sum);
    std::vector<int32_t> order;
    for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) if (i != 7) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    int32_t chosen = static_cast<int32_t>(rng() % logits.size());
    if (chosen == 7) chosen = 8;  // not the NaN
    const auto [logprob, top] = log_softmax_at(logits, chosen, 20);
    EXPECT_NEAR(logprob, logits[chosen] - lse, 1e-5);
    ASSERT_EQ(top.size(), 20u);
    for (size_t k = 0; k < top.size(); ++k) {
      EXPECT_EQ(top[k].first, order[k]) << "rank " << k;
      EXPECT_NEAR(top[k].second, logits[order[k]] - lse, 1e-5);
    }
    EXPECT_TRUE(log_softmax_at(logits, chosen, 0).second.empty());
  }
}

}  // namespace
}  // namespace specula
