// Which draft shape a speculative step runs (issue 50): a cost model the engine measures itself
// (the seconds of one step of each shape, per batch size: priors from a start-up calibration on
// stand-in requests, then an average of the steps actually run) and each request's running
// acceptance per tree depth; the policy picks, for the current batch, the shape with the most
// expected committed tokens per second, or "off" (a plain decode step; the draft catches up on
// what it missed when the request drafts again) when nothing beats it.
//
// A step's time is the whole step (planning, scratch pages, building and running it, the draft
// extend) less the per-token work (emission, stop checks, streaming), which costs the same per
// token with or without speculation. The cycle's fixed host work counts: left out, on a model
// whose whole cycle is a fraction of a millisecond it made short chains look cheaper than they
// are (docs/PERFORMANCE.md, issue 50's section). Start-up priors (spec_calibration) time the
// model work of stand-in cycles; each shape's measurements replace them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "specula/speculative/eagle_tree.h"

namespace specula {

enum class SpecPolicyKind { FIXED, AUTO };
std::string_view spec_policy_name(SpecPolicyKind kind);
// "fixed" or "auto"; throws specula::Error naming the allowed values.
SpecPolicyKind parse_spec_policy(std::string_view name);

// A step's shape. num_draft_tokens 1 (and num_steps 0) is "off": a plain decode step.
struct SpecShape {
  int num_steps = 0;
  int num_draft_tokens = 1;
  bool off() const { return num_draft_tokens == 1; }
  bool operator==(const SpecShape&) const = default;
  std::string str() const;  // "off" or "(steps, draft tokens)"
};

// The shapes a policy may pick for a head built with `max` (the configured shape): FIXED: max
// only. AUTO: off, then for chains (topk 1) every chain (s, s + 1) for s = 1..num_steps, for trees
// (topk > 1) the configured tree. Each shape's drafts are those of max cut short, so a head built
// for max runs them all.
std::vector<SpecShape> policy_shapes(const SpecParams& max, SpecPolicyKind kind);

// Per-depth acceptance as an exponential average: rate(d) estimates the chance that the draft
// token at depth d is accepted when its parent was (d = 1: the root's child).
class DepthAcceptance {
 public:
  static constexpr double kAlpha = 0.1;         // weight of the newest cycle: a request's estimate
  static constexpr double kEngineAlpha = 0.01;  // the engine-wide estimate's (about 100 cycles)

  explicit DepthAcceptance(double alpha = kAlpha) : alpha_(alpha) {}

  // A cycle of max depth `depth` that accepted `accepted` draft tokens (0..depth): depths
  // 1..accepted were accepted, depth accepted + 1 (if <= depth) was not; deeper ones say nothing.
  // Depths past the chain (a shape shorter than the longest) move the same weight of the way to the
  // chain's last depth: they are not observed while short chains run, and left as they were, a
  // dip that made the policy pick a short chain would keep it there for good.
  void observe(int depth, int accepted);
  // Starts from another's rates (a new request starts from the engine-wide average); keeps its own
  // weight.
  void seed(const DepthAcceptance& from) { rates_ = from.rates_; }
  // Moves kAlpha of the way to another's rates: a request that is not drafting learns nothing of
  // its own, and its estimate must not keep it off speculation for good.
  void drift_to(const DepthAcceptance& to);
  // The rate at depth d (1-based); depths never observed take the deepest rate known, or prior.
  double rate(int d) const;
  // Expected committed tokens of a cycle of max depth `depth`: the bonus plus the expected run.
  double expected_tokens(int depth) const;

  static constexpr double kPrior = 0.7;

 private:
  double alpha_;
  std::vector<double> rates_;
};

// Seconds of one step per (batch bucket, shape): a prior (calibration), then from the first
// measurement (which meets the prior halfway) an exponential average of measured steps.
class SpecCostModel {
 public:
  static constexpr double kAlpha = 0.2;

  // bucket_sizes: the batch sizes costs are kept for (the captured graph sizes); a batch counts
  // as the smallest bucket that holds it (a graph runs it padded), or as itself above them all.
  explicit SpecCostModel(std::vector<int> bucket_sizes = {});
  int bucket(int batch_size) const;
  void set_prior(int batch_size, const SpecShape& shape, double seconds);
  // A measured step (seconds <= 0, a step that did not run, is ignored).
  void observe(int batch_size, const SpecShape& shape, double seconds);
  // The estimate, or nullopt when the bucket has neither a prior nor a measurement.
  std::optional<double> seconds(int batch_size, const SpecShape& shape) const;
  int64_t measured(int batch_size, const SpecShape& shape) const;
  // Catching the draft up on the tokens it missed while speculation was off (a target extend over
  // them and a draft extend): seconds per missed token, per bucket, as the ratio of exponential
  // averages of the catch-ups' seconds and tokens. An average of each catch-up's own per-token
  // figure let the few-token ones, mostly fixed cost, set it: on the VM 0.91 ms per token against
  // 0.23 for the run's catch-ups taken together.
  void observe_catch_up(int batch_size, int64_t tokens, double seconds);
  std::optional<double> catch_up_per_token(int batch_size) const;

 private:
  struct Entry {
    double seconds = 0;
    int64_t measured = 0;
    bool known = false;
  };
  std::vector<int> buckets_;
  std::map<std::pair<int, std::pair<int, int>>, Entry> entries_;
  struct CatchUp {
    double seconds = 0, tokens = 0;  // exponential averages per catch-up
    bool known = false;
  };
  std::map<int, CatchUp> catch_up_;
  const Entry* find(int batch_size, const SpecShape& shape) const;
};

// A request's lag behind its draft: the tokens it ran with speculation off (whose pairs the draft
// must catch up on before it drafts again), and the new tokens it may still produce.
struct SpecLag {
  int64_t missed = 0;
  int64_t remaining = 0;
};

// Why a shape was chosen: each candidate's expected tokens and seconds.
struct SpecChoice {
  SpecShape shape;
  double tokens_per_s = 0;
  bool explored = false;  // chosen to measure it, not for its estimate
  std::string why;        // "(7, 8) 41.2k tok/s > off 30.1k tok/s"
};

class SpecPolicy {
 public:
  // Cycles between two explorations of a bucket's runner-up, and how many cycles one runs (the
  // scheduler learns a cost from a shape's second cycle in a row on).
  static constexpr int kExploreEvery = 64;
  static constexpr int kExploreCycles = 2;
  // An exploration of a drafting shape from off waits, once due, for a batch that lags by at most
  // a token a request, up to this many choices since the last one.
  static constexpr int kExploreLate = 4 * kExploreEvery;
  // A bucket keeps its shape until another's estimate beats it by this much: estimates carry
  // noise, and each change costs (a cycle that pays the previous shape's tail, a catch-up of the
  // draft after speculation was off).
  static constexpr double kSwitchMargin = 0.05;

  SpecPolicy(SpecPolicyKind kind, const SpecParams& max, std::vector<int> bucket_sizes = {});

  SpecPolicyKind kind() const { return kind_; }
  const std::vector<SpecShape>& shapes() const { return shapes_; }
  SpecCostModel& costs() { return costs_; }
  const SpecCostModel& costs() const { return costs_; }
  // The engine-wide acceptance, which new requests start from.
  DepthAcceptance& acceptance() { return acceptance_; }

  // The shape for a batch whose requests have these acceptances. Shapes with no estimate for the
  // batch's bucket are tried first (largest first), then the estimated best (the bucket's
  // current shape unless beaten by kSwitchMargin); every kExploreEvery choices of a bucket the
  // runner-up runs kExploreCycles cycles so that its estimate stays current (a drafting runner-up
  // of a bucket that is off waits for a batch that is caught up, up to kExploreLate choices).
  // lags (one per request, or empty: none lags): once the bucket has a measured catch-up cost
  // per missed token, the catch-up is priced into the rates. A drafting shape pays each lagging
  // request's catch-up first, spread over the cycles that request has left (its remaining tokens
  // at the shape's expected tokens per cycle: a long request amortises it, a nearly finished one
  // does not). Where drafting is expected to resume (at the engine-wide acceptance some drafting
  // shape runs on faster than off, catch-ups aside), "off" pays the catch-up it defers: each
  // request that has tokens left after this step will have one more pair to catch up on, so a
  // dip in a request's acceptance must outweigh that to turn speculation off. Both lean toward
  // drafting on purpose (a hysteresis against dips): off pays in full for a pair it may never
  // catch up on, and remaining counts to max_new_tokens, which an end-of-sequence token may cut
  // short. Where off runs on fastest at the engine-wide acceptance it pays nothing deferred.
  SpecChoice choose(const std::vector<const DepthAcceptance*>& requests, const std::vector<SpecLag>& lags = {});
  // Tests: from now on choose() cycles through `sequence` (each one of shapes()), whatever the
  // costs say, so that every transition between shapes is exercised; empty: back to the costs.
  void force_sequence(std::vector<SpecShape> sequence);
  // After a cycle of `shape`: its measured seconds.
  void observe(int batch_size, const SpecShape& shape, double seconds) { costs_.observe(batch_size, shape, seconds); }

 private:
  SpecPolicyKind kind_;
  std::vector<SpecShape> shapes_;
  SpecCostModel costs_;
  // Averaged over about 100 cycles: the prior new requests start from and requests that are not
  // drafting drift toward; with a request's 10-cycle weight it followed the last few cycles of
  // whichever requests ran (on the VM its (7, 8) estimate read 7.61 tokens where the run's cycles
  // averaged 5.03).
  DepthAcceptance acceptance_{DepthAcceptance::kEngineAlpha};
  struct Bucket {
    int64_t since_explore = 0;  // choices since the bucket's last exploration
    SpecShape current{-1, -1};
    SpecShape exploring{-1, -1};
    int explore_left = 0;
  };
  std::map<int, Bucket> buckets_;
  std::vector<SpecShape> forced_;
  size_t forced_next_ = 0;
};

}  // namespace specula
