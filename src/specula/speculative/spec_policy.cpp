// SpecPolicy, SpecCostModel and DepthAcceptance.
#include "specula/speculative/spec_policy.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "specula/core/error.h"

namespace specula {

std::string_view spec_policy_name(SpecPolicyKind kind) { return kind == SpecPolicyKind::FIXED ? "fixed" : "auto"; }

SpecPolicyKind parse_spec_policy(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "fixed") return SpecPolicyKind::FIXED;
  if (lower == "auto") return SpecPolicyKind::AUTO;
  throw Error(fmt::format("--speculative-policy '{}' is not supported; use fixed or auto", name));
}

std::string SpecShape::str() const {
  return off() ? std::string("off") : fmt::format("({}, {})", num_steps, num_draft_tokens);
}

std::vector<SpecShape> policy_shapes(const SpecParams& max, SpecPolicyKind kind) {
  const SpecShape configured{max.num_steps, max.num_draft_tokens};
  if (kind == SpecPolicyKind::FIXED) return {configured};
  std::vector<SpecShape> shapes{SpecShape{}};
  if (max.topk == 1) {
    for (int s = 1; s <= max.num_steps; ++s) shapes.push_back({s, s + 1});
  } else {
    shapes.push_back(configured);
  }
  return shapes;
}

void DepthAcceptance::observe(int depth, int accepted) {
  SPECULA_ASSERT(accepted >= 0 && accepted <= depth, "accepted {} of a depth-{} cycle", accepted, depth);
  const int seen = std::min(depth, accepted + 1);
  for (int d = 1; d <= seen; ++d) {
    if (static_cast<int>(rates_.size()) < d) rates_.push_back(rate(d));
    double& r = rates_[static_cast<size_t>(d - 1)];
    r += alpha_ * ((d <= accepted ? 1.0 : 0.0) - r);
  }
  if (depth < 1) return;
  const double last = rate(depth);
  for (size_t d = static_cast<size_t>(depth); d < rates_.size(); ++d) rates_[d] += alpha_ * (last - rates_[d]);
}

void DepthAcceptance::drift_to(const DepthAcceptance& to) {
  const size_t depths = std::max(rates_.size(), to.rates_.size());
  std::vector<double> now(depths);
  for (size_t d = 1; d <= depths; ++d) now[d - 1] = rate(static_cast<int>(d));
  for (size_t d = 1; d <= depths; ++d) now[d - 1] += kAlpha * (to.rate(static_cast<int>(d)) - now[d - 1]);
  rates_ = std::move(now);
}

double DepthAcceptance::rate(int d) const {
  if (rates_.empty()) return kPrior;
  return rates_[static_cast<size_t>(std::min(d, static_cast<int>(rates_.size())) - 1)];
}

double DepthAcceptance::expected_tokens(int depth) const {
  double tokens = 1.0, reach = 1.0;
  for (int d = 1; d <= depth; ++d) {
    reach *= rate(d);
    tokens += reach;
  }
  return tokens;
}

SpecCostModel::SpecCostModel(std::vector<int> bucket_sizes) : buckets_(std::move(bucket_sizes)) {
  std::sort(buckets_.begin(), buckets_.end());
}

int SpecCostModel::bucket(int batch_size) const {
  const auto it = std::lower_bound(buckets_.begin(), buckets_.end(), batch_size);
  return it != buckets_.end() ? *it : batch_size;
}

void SpecCostModel::set_prior(int batch_size, const SpecShape& shape, double seconds) {
  Entry& e = entries_[{bucket(batch_size), {shape.num_steps, shape.num_draft_tokens}}];
  if (e.measured > 0) return;
  e.seconds = seconds;
  e.known = true;
}

void SpecCostModel::observe(int batch_size, const SpecShape& shape, double seconds) {
  if (!(seconds > 0)) return;  // a step that did not run
  Entry& e = entries_[{bucket(batch_size), {shape.num_steps, shape.num_draft_tokens}}];
  // The first measurement meets the prior halfway (one sample is noisy, and the prior timed the
  // stand-ins only); without a prior it is the estimate.
  if (e.measured == 0) {
    e.seconds = e.known ? 0.5 * (e.seconds + seconds) : seconds;
  } else {
    e.seconds += kAlpha * (seconds - e.seconds);
  }
  e.known = true;
  ++e.measured;
}

const SpecCostModel::Entry* SpecCostModel::find(int batch_size, const SpecShape& shape) const {
  const auto it = entries_.find({bucket(batch_size), {shape.num_steps, shape.num_draft_tokens}});
  return it != entries_.end() && it->second.known ? &it->second : nullptr;
}

std::optional<double> SpecCostModel::seconds(int batch_size, const SpecShape& shape) const {
  const Entry* e = find(batch_size, shape);
  if (e == nullptr) return std::nullopt;
  return e->seconds;
}

int64_t SpecCostModel::measured(int batch_size, const SpecShape& shape) const {
  const Entry* e = find(batch_size, shape);
  return e != nullptr ? e->measured : 0;
}

void SpecCostModel::observe_catch_up(int batch_size, int64_t tokens, double seconds) {
  if (tokens <= 0 || !(seconds > 0)) return;
  CatchUp& e = catch_up_[bucket(batch_size)];
  const auto n = static_cast<double>(tokens);
  if (e.known) {
    e.seconds += kAlpha * (seconds - e.seconds);
    e.tokens += kAlpha * (n - e.tokens);
  } else {
    e.seconds = seconds;
    e.tokens = n;
    e.known = true;
  }
}

std::optional<double> SpecCostModel::catch_up_per_token(int batch_size) const {
  const auto it = catch_up_.find(bucket(batch_size));
  if (it == catch_up_.end() || !it->second.known) return std::nullopt;
  return it->second.seconds / it->second.tokens;
}

SpecPolicy::SpecPolicy(SpecPolicyKind kind, const SpecParams& max, std::vector<int> bucket_sizes)
    : kind_(kind), shapes_(policy_shapes(max, kind)), costs_(std::move(bucket_sizes)) {}

void SpecPolicy::force_sequence(std::vector<SpecShape> sequence) {
  for (const SpecShape& s : sequence) {
    SPECULA_CHECK(std::find(shapes_.begin(), shapes_.end(), s) != shapes_.end(),
                  "draft shape {} is not one the {} policy runs", s.str(), spec_policy_name(kind_));
  }
  forced_ = std::move(sequence);
  forced_next_ = 0;
}

SpecChoice SpecPolicy::choose(const std::vector<const DepthAcceptance*>& requests, const std::vector<SpecLag>& lags) {
  SPECULA_ASSERT(!requests.empty());
  SPECULA_CHECK(lags.empty() || lags.size() == requests.size(), "{} lags for {} requests", lags.size(), requests.size());
  if (!forced_.empty()) {
    const SpecShape s = forced_[forced_next_++ % forced_.size()];
    return {s, 0, false, "forced"};
  }
  if (shapes_.size() == 1) return {shapes_[0], 0, false, "fixed"};
  const int bs = static_cast<int>(requests.size());
  const int bucket = costs_.bucket(bs);
  // A shape this bucket never saw is measured before any estimate is trusted (largest first:
  // the configured shape is what the user asked for).
  for (auto it = shapes_.rbegin(); it != shapes_.rend(); ++it) {
    if (!costs_.seconds(bs, *it)) return {*it, 0, true, fmt::format("{} has no cost for batch {} yet", it->str(), bucket)};
  }
  struct Rated {
    SpecShape shape;
    double rate;
  };
  // Whether drafting is expected to resume: at the engine-wide acceptance (the long-run estimate
  // requests start from and drift back to while off), some drafting shape runs on faster than off
  // (catch-ups aside). Only then does a step off defer a catch-up worth charging it: a dip in one
  // request's acceptance must outweigh the pair it leaves behind. Where off runs on fastest, its
  // requests are not expected to draft again; charging it their catch-ups kept speculation on
  // where it lost (on the VM's CPU, 20% below plain decoding).
  bool off_defers = false;
  const double off_rate = static_cast<double>(bs) / *costs_.seconds(bs, SpecShape{});
  for (const SpecShape& s : shapes_) {
    if (s.off()) continue;
    const double tokens = static_cast<double>(bs) * acceptance_.expected_tokens(s.num_steps);
    off_defers = off_defers || tokens / *costs_.seconds(bs, s) > off_rate;
  }
  std::vector<Rated> rated;
  const double per_missed = costs_.catch_up_per_token(bs).value_or(0.0);
  for (const SpecShape& s : shapes_) {
    double tokens = 0, catch_up = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const double expected = requests[i]->expected_tokens(s.num_steps);
      tokens += expected;
      if (lags.empty() || per_missed == 0) continue;
      const SpecLag& lag = lags[i];
      if (s.off()) {
        if (off_defers && lag.remaining > 1) catch_up += per_missed;
      } else if (lag.missed > 0) {
        const double cycles_left = std::max(1.0, static_cast<double>(lag.remaining) / expected);
        catch_up += per_missed * static_cast<double>(lag.missed) / cycles_left;
      }
    }
    rated.push_back({s, tokens / (*costs_.seconds(bs, s) + catch_up)});
  }
  // Best first; ties go to the shape listed first (off, then shorter drafts).
  std::stable_sort(rated.begin(), rated.end(), [](const Rated& a, const Rated& b) { return a.rate > b.rate; });
  Bucket& b = buckets_[bucket];
  auto find = [&](const SpecShape& s) {
    return std::find_if(rated.begin(), rated.end(), [&](const Rated& r) { return r.shape == s; });
  };
  if (b.explore_left > 0) {
    --b.explore_left;
    const auto e = find(b.exploring);
    return {b.exploring, e->rate, true, fmt::format("{} (exploring, cycle {})", b.exploring.str(), kExploreCycles - b.explore_left)};
  }
  // The bucket's shape stays unless the best beats it by the margin.
  const auto current = find(b.current);
  const Rated& best = current != rated.end() && rated[0].rate <= current->rate * (1 + kSwitchMargin) ? *current : rated[0];
  b.current = best.shape;
  const Rated& other = best.shape == rated[0].shape ? rated[1] : rated[0];
  // Exploring a drafting shape from off first catches the draft up on every token the batch ran
  // off; once due, that waits for a batch that lags by at most a token a request (new requests
  // arrive caught up), up to kExploreLate choices.
  int64_t missed = 0;
  for (const SpecLag& lag : lags) missed += lag.missed;
  const bool costly = best.shape.off() && !other.shape.off() && missed > static_cast<int64_t>(requests.size());
  if (++b.since_explore >= kExploreEvery && (!costly || b.since_explore >= kExploreLate)) {
    b.since_explore = 0;
    b.exploring = other.shape;
    b.explore_left = kExploreCycles - 1;
    return {other.shape, other.rate, true,
            fmt::format("{} {:.0f} tok/s (exploring, cycle 1) vs {} {:.0f} tok/s at batch {}", other.shape.str(), other.rate,
                        best.shape.str(), best.rate, bucket)};
  }
  std::string why = fmt::format("{} {:.0f} tok/s vs {} {:.0f} tok/s at batch {}", best.shape.str(), best.rate,
                                other.shape.str(), other.rate, bucket);
  return {best.shape, best.rate, false, std::move(why)};
}

}  // namespace specula
