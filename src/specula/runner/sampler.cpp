// Sampler implementation: filters apply in the order top-k, top-p, min-p (as in SGLang), each on
// the temperature-scaled distribution.
#include "specula/runner/sampler.h"
#include "specula/runner/softmax_weights.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "specula/core/error.h"
#include "specula/model/tokenizer.h"

namespace specula {

void SamplingParams::validate() const {
  SPECULA_CHECK(temperature >= 0.0f && std::isfinite(temperature), "temperature {} is not valid; expected >= 0",
                temperature);
  SPECULA_CHECK(top_k >= 0, "top_k {} is not valid; expected >= 0 (0: no limit)", top_k);
  SPECULA_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p {} is not valid; expected 0 < top_p <= 1", top_p);
  SPECULA_CHECK(min_p >= 0.0f && min_p < 1.0f, "min_p {} is not valid; expected 0 <= min_p < 1", min_p);
  SPECULA_CHECK(repetition_penalty > 0.0f && std::isfinite(repetition_penalty),
                "repetition_penalty {} is not valid; expected > 0 (1: off)", repetition_penalty);
  SPECULA_CHECK(std::isfinite(frequency_penalty) && std::isfinite(presence_penalty),
                "frequency_penalty {} / presence_penalty {} must be finite", frequency_penalty, presence_penalty);
}

std::shared_ptr<const grammar::Vocabulary> grammar_vocabulary(const Tokenizer& tokenizer, int vocab_size) {
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (!tokenizer.is_special(id)) tokens[static_cast<size_t>(id)] = tokenizer.token_raw_bytes(id);
  }
  return std::make_shared<const grammar::Vocabulary>(std::move(tokens));
}

int32_t greedy_token(std::span<const float> logits) {
  // One pass: NaN and -inf never compare greater, and `>` keeps the first of equal maxima.
  float best = -INFINITY;
  int32_t token = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best) {
      best = logits[i];
      token = static_cast<int32_t>(i);
    }
  }
  return token;
}

int32_t checked_greedy_token(int32_t token) {
  SPECULA_CHECK(token >= 0, "sampling from logits that are all NaN or -inf");
  return token;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

void Sampler::observe_prompt(std::span<const int32_t> prompt_ids) { seen_.insert(prompt_ids.begin(), prompt_ids.end()); }

std::span<const float> Sampler::penalized(std::span<const float> raw, std::span<const int32_t> pending) {
  // pending: a tree path; its order does not matter to the penalties.
  if (!has_penalties()) return raw;
  work_.assign(raw.begin(), raw.end());
  // Each token penalised once for repetition and once with its total count, as if pending had
  // been recorded: the same arithmetic as sample() after record() of each. pending is a tree
  // path (at most num_steps tokens): counted in a small vector, not by copying the sets.
  pending_counts_.clear();
  for (int32_t id : pending) {
    auto it = std::find_if(pending_counts_.begin(), pending_counts_.end(), [id](const auto& e) { return e.first == id; });
    if (it == pending_counts_.end()) {
      pending_counts_.emplace_back(id, 1);
    } else {
      ++it->second;
    }
  }
  auto pending_count = [&](int32_t id) {
    for (const auto& [p, n] : pending_counts_) {
      if (p == id) return n;
    }
    return 0;
  };
  auto repeat = [&](int32_t id) {
    if (id < 0 || static_cast<size_t>(id) >= work_.size()) return;
    float& x = work_[static_cast<size_t>(id)];
    x = x > 0.0f ? x / params_.repetition_penalty : x * params_.repetition_penalty;
  };
  auto count = [&](int32_t id, int n) {
    if (id < 0 || static_cast<size_t>(id) >= work_.size()) return;
    work_[static_cast<size_t>(id)] -= params_.frequency_penalty * static_cast<float>(n) + params_.presence_penalty;
  };
  for (int32_t id : seen_) repeat(id);
  for (const auto& [id, n] : output_counts_) count(id, n + pending_count(id));
  for (const auto& [id, n] : pending_counts_) {
    if (!seen_.contains(id)) repeat(id);
    if (!output_counts_.contains(id)) count(id, n);
  }
  return work_;
}

namespace {

constexpr const char* kNothingFits = "grammar: no token of the vocabulary can continue the output here";

// Pops a speculative path off the grammar however the scope is left.
struct PathGuard {
  grammar::TokenConstraint* constraint;
  size_t n;
  ~PathGuard() { constraint->pop(n); }
};

}  // namespace

std::span<const float> Sampler::adjusted(std::span<const float> raw, std::span<const int32_t> path) {
  const std::span<const float> logits = penalized(raw, path);
  if (constraint_ == nullptr || !constraint_->push(path)) return logits;
  const PathGuard guard{constraint_.get(), path.size()};
  if (path.empty() && premasked_ && premask_.size() == (logits.size() + 31) / 32) {
    masked_.resize(logits.size());
    grammar::masked_copy(logits, premask_, masked_);
  } else {
    masked_.assign(logits.begin(), logits.end());
    constraint_->mask(masked_);
  }
  // Below the root, a node where the grammar admits nothing (it finished and no end token is
  // allowed) is never sampled from: the request stops at the node's token.
  if (!path.empty() && std::none_of(masked_.begin(), masked_.end(), [](float x) { return x > -INFINITY; })) {
    return logits;
  }
  return masked_;
}

int32_t Sampler::greedy_at(std::span<const float> raw, std::span<const int32_t> path) {
  const std::span<const float> logits = penalized(raw, path);
  const int32_t best = greedy_token(logits);
  if (constraint_ == nullptr || best < 0 || !constraint_->push(path)) return best;
  const PathGuard guard{constraint_.get(), path.size()};
  // The model's choice usually fits the grammar: a few of the best are checked one by one before
  // the whole vocabulary is masked.
  constexpr int kTries = 8;
  int32_t token = best;
  bool copied = false;
  for (int i = 0; i < kTries && token >= 0 && !constraint_->allows(token); ++i) {
    if (!copied) masked_.assign(logits.begin(), logits.end());
    copied = true;
    masked_[static_cast<size_t>(token)] = -INFINITY;
    token = greedy_token(masked_);
  }
  if (token >= 0 && !constraint_->allows(token)) {
    constraint_->mask(masked_);
    token = greedy_token(masked_);
  }
  // As in adjusted(): a node below the root where nothing fits is never emitted from.
  if (token < 0 && !path.empty()) return best;
  SPECULA_CHECK(token >= 0, kNothingFits);
  return token;
}

int32_t Sampler::sample(std::span<const float> raw_logits) {
  const int32_t token = greedy() ? checked_greedy_token(greedy_at(raw_logits, {})) : pick(adjusted(raw_logits, {}));
  record(token);
  return token;
}

std::span<const float> Sampler::clean(std::span<const float> raw) {
  // NaN would break the ordering below; it counts as impossible (-inf). +inf dominates.
  const RowValues values = row_values(raw);
  if (values.sane) {
    SPECULA_CHECK(values.any_finite, "sampling from logits that are all NaN or -inf");
    return raw;
  }
  clean_.assign(raw.begin(), raw.end());
  bool has_pos_inf = false;
  for (float x : clean_) has_pos_inf = has_pos_inf || (std::isinf(x) && x > 0);
  for (float& x : clean_) {
    if (std::isnan(x)) x = -INFINITY;
    else if (has_pos_inf) x = std::isinf(x) && x > 0 ? 0.0f : -INFINITY;  // only the +inf tokens remain
  }
  SPECULA_CHECK(std::any_of(clean_.begin(), clean_.end(), [](float x) { return std::isfinite(x); }),
                "sampling from logits that are all NaN or -inf");
  return clean_;
}

size_t Sampler::filter(std::span<const float> logits, std::vector<int32_t>& order, std::vector<double>& probs) {
  // Candidates in the order of a stable sort by logit (ties: the lower id first), but only as far
  // as the filters need it: no sort at all without top-p or min-p, a selection of k for top-k, and
  // for top-p / min-p a prefix sorted in growing steps until the filter is decided (the nucleus is
  // usually small next to a 128k vocabulary).
  const auto before = [&](int32_t a, int32_t b) {
    const float x = logits[static_cast<size_t>(a)], y = logits[static_cast<size_t>(b)];
    return x > y || (x == y && a < b);
  };
  order.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > -INFINITY) order.push_back(static_cast<int32_t>(i));
  }
  size_t keep = order.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::nth_element(order.begin(), order.begin() + static_cast<int64_t>(keep), order.end(), before);
    order.resize(keep);
  }
  float top = -INFINITY;
  for (int32_t id : order) top = std::max(top, logits[static_cast<size_t>(id)]);
  // Each token's weight exp((logit - top) / temperature), the whole row at once, by id; the sum
  // over the candidates only when top-k left some out.
  weights_.resize(logits.size());
  double sum = softmax_weights(logits, top, params_.temperature, weights_);
  if (keep < logits.size() && params_.top_k > 0) {
    sum = 0;
    for (int32_t id : order) sum += weights_[static_cast<size_t>(id)];
  }
  const auto weight = [&](int32_t id) { return static_cast<double>(weights_[static_cast<size_t>(id)]); };
  size_t sorted = 0;
  const auto sort_prefix = [&](size_t upto) {
    upto = std::min(upto, keep);
    if (upto <= sorted) return;
    const auto first = order.begin() + static_cast<int64_t>(sorted), last = order.begin() + static_cast<int64_t>(keep);
    if (upto < keep) std::nth_element(first, order.begin() + static_cast<int64_t>(upto), last, before);
    std::sort(first, order.begin() + static_cast<int64_t>(upto), before);
    sorted = upto;
  };
  if (params_.top_p < 1.0f || params_.min_p > 0.0f) {
    const double threshold = params_.min_p > 0.0f ? params_.min_p / sum : 0.0;  // min-p against the best (weight 1)
    double cumulative = 0;
    size_t cut = keep;
    for (size_t i = 0, step = 64; i < keep; ++i) {
      if (i == sorted) {
        sort_prefix(sorted + step);
        step *= 2;
      }
      const double p = weight(order[i]) / sum;
      if (params_.min_p > 0.0f && i > 0 && p < threshold) {
        cut = i;
        break;
      }
      cumulative += p;
      if (params_.top_p < 1.0f && cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  probs.resize(keep);
  for (size_t i = 0; i < keep; ++i) probs[i] = weight(order[i]) / sum;
  return keep;
}

int32_t Sampler::pick(std::span<const float> raw) {
  if (greedy()) return checked_greedy_token(greedy_token(raw));
  const std::span<const float> logits = clean(raw);
  if (params_.top_k == 0 && params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    // No filter: the same draw as below over every token in id order, without building the
    // candidate list (a 128k-token row in tens of microseconds).
    weights_.resize(logits.size());
    const double sum = softmax_weights(logits, row_max(logits), params_.temperature, weights_, &block_sums_);
    const double u = uniform() * sum;
    // The block the draw lands in, then the token inside it.
    double running = 0;
    size_t block = 0;
    while (block + 1 < block_sums_.size() && u >= running + block_sums_[block]) running += block_sums_[block++];
    for (size_t i = block * kSoftmaxBlock; i < weights_.size(); ++i) {
      running += weights_[i];
      if (weights_[i] > 0.0f && u < running) return static_cast<int32_t>(i);
    }
    // Rounding left u at the total: the last token of positive weight (the top one has weight 1).
    size_t i = weights_.size();
    while (i > 0 && weights_[i - 1] <= 0.0f) --i;
    return static_cast<int32_t>(i - 1);
  }
  const size_t keep = filter(logits, order_, probs_);
  // The first kept token whose running sum passes a uniform draw over their total.
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += probs_[i];
  const double u = uniform() * total;
  double running = 0;
  size_t last = 0;  // the last candidate of positive weight: where rounding leaves u at the total
  for (size_t i = 0; i < keep; ++i) {
    if (probs_[i] <= 0) continue;
    running += probs_[i];
    last = i;
    if (u < running) return order_[i];
  }
  return order_[last];
}

void Sampler::distribution(std::span<const float> raw, std::vector<float>& out) {
  SPECULA_CHECK(!greedy(), "a sampling distribution needs temperature >= 1e-5 (below, sampling is greedy)");
  const std::span<const float> logits = clean(raw);
  const size_t keep = filter(logits, order_, probs_);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs_[i];
  out.assign(logits.size(), 0.0f);
  for (size_t i = 0; i < keep; ++i) out[static_cast<size_t>(order_[i])] = static_cast<float>(probs_[i] / sum);
}

int32_t Sampler::take_argmax(int32_t token) {
  SPECULA_ASSERT(picks_argmax());
  record(checked_greedy_token(token));
  return token;
}

int32_t Sampler::take_masked_argmax(int32_t token) {
  SPECULA_ASSERT(picks_masked_argmax());
  SPECULA_CHECK(token >= 0, kNothingFits);
  record(token);
  return token;
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

void Sampler::premask(int vocab_size) {
  premasked_ = false;
  if (constraint_ == nullptr) return;
  premask_.resize((static_cast<size_t>(vocab_size) + 31) / 32);
  try {
    constraint_->fill_bitmask(premask_);
  } catch (const std::exception&) {
    return;
  }
  premasked_ = true;
}

void Sampler::record(int32_t token) {
  premasked_ = false;
  if (constraint_ != nullptr) constraint_->accept(token);
  seen_.insert(token);
  ++output_counts_[token];
}

std::pair<float, std::vector<std::pair<int32_t, float>>> log_softmax_at(std::span<const float> logits, int32_t token,
                                                                       int top_n) {
  SPECULA_ASSERT(token >= 0 && static_cast<size_t>(token) < logits.size() && top_n >= 0);
  const auto value = [&](size_t i) {
    const float x = logits[i];
    return std::isnan(x) ? -std::numeric_limits<double>::infinity() : static_cast<double>(x);
  };
  double max = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) max = std::max(max, value(i));
  double sum = 0;
  if (std::isfinite(max)) {
    for (size_t i = 0; i < logits.size(); ++i) sum += std::exp(value(i) - max);
  }
  const double lse = std::isfinite(max) ? max + std::log(sum) : max;
  const auto logprob = [&](size_t i) {
    const double v = value(i);
    return static_cast<float>(std::isfinite(lse) ? v - lse : (v == max ? 0.0 : -std::numeric_limits<double>::infinity()));
  };
  // The top_n (at most kMaxTopLogprobs) best ids, kept sorted while scanning: no buffer the size
  // of the vocabulary on this per-token path. Ties keep the lower id (it is met first).
  const auto n = std::min(static_cast<size_t>(top_n), logits.size());
  std::vector<int32_t> best;
  best.reserve(n + 1);
  for (size_t i = 0; i < logits.size() && n > 0; ++i) {
    if (best.size() == n && value(i) <= value(static_cast<size_t>(best.back()))) continue;
    auto at = best.end();
    while (at != best.begin() && value(static_cast<size_t>(*(at - 1))) < value(i)) --at;
    best.insert(at, static_cast<int32_t>(i));
    if (best.size() > n) best.pop_back();
  }
  std::vector<std::pair<int32_t, float>> top;
  for (int32_t id : best) top.emplace_back(id, logprob(static_cast<size_t>(id)));
  return {logprob(static_cast<size_t>(token)), std::move(top)};
}

}  // namespace specula
