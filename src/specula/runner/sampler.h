// Sampler: picks the next token from a row of logits. Penalties first (SGLang's semantics:
// repetition over prompt and output, HF-style divide/multiply; frequency and presence over the
// output only), then temperature 0 is greedy (argmax, lowest id on ties); otherwise
// softmax(logits / temperature) restricted by top-k, top-p (nucleus) and min-p, drawn from a
// generator seeded per request so runs are reproducible.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "specula/grammar/token_constraint.h"

namespace specula {

class Tokenizer;

// The bytes a grammar sees for each of the model's vocab_size ids: the tokenizer's raw bytes, none
// for special tokens and for ids the tokenizer lacks (padding rows), which a grammar never allows.
std::shared_ptr<const grammar::Vocabulary> grammar_vocabulary(const Tokenizer& tokenizer, int vocab_size);

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;       // 0: no limit
  float top_p = 1.0f;  // 1: no limit
  float min_p = 0.0f;  // 0: no limit
  uint64_t seed = 0;
  float repetition_penalty = 1.0f;  // > 1 discourages tokens seen in prompt or output
  float frequency_penalty = 0.0f;   // subtracted once per earlier occurrence in the output
  float presence_penalty = 0.0f;    // subtracted once if the token occurred in the output

  // Throws specula::Error naming the bad value.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  void observe_prompt(std::span<const int32_t> prompt_ids);
  // Structured output: only tokens the grammar allows are picked (the mask applies after the
  // penalties, before temperature and the filters), and each recorded token advances it.
  void constrain(std::unique_ptr<grammar::TokenConstraint> constraint) {
    constraint_ = std::move(constraint);
    premasked_ = false;
  }
  bool constrained() const { return constraint_ != nullptr; }
  // The grammar admits nothing but the end: the output is complete.
  bool grammar_terminated() const { return constraint_ != nullptr && constraint_->terminated(); }
  // Picks a token and records it as output (for the penalties).
  int32_t sample(std::span<const float> logits);
  // sample() of a temperature > 0 request in three parts, so that a batch can draw its rows on
  // several threads: prepare() applies the penalties and the grammar's mask (what rows of one
  // grammar share is its masker, which is thread-safe), draw() picks from what it returned (this
  // sampler's generator and scratch); both on any thread, one call per sampler at a time; commit()
  // records.
  std::span<const float> prepare(std::span<const float> logits) { return adjusted(logits, {}); }
  // With a grammar: fills the mask of its current state for a vocabulary of vocab_size ids ahead
  // of prepare() (which then only applies it), e.g. while a GPU runs the step; valid until the
  // next recorded token. A grammar whose mask fails here leaves prepare() to compute it (and
  // raise the error).
  void premask(int vocab_size);
  int32_t draw(std::span<const float> prepared) { return pick(prepared); }
  void commit(int32_t token) { record(token); }

  // For speculative verification: the logits sample() would pick from had it also emitted `path`
  // (a tree node's draft tokens below the root, in order, not recorded yet): the penalties applied
  // over the prompt, the recorded output and path, then the grammar's mask after path; raw itself
  // when there is neither (and the grammar's mask is skipped for a path it rejects, a node no
  // emitted sequence can reach). greedy_at: the token a greedy sample() would pick there, without
  // masking the whole vocabulary when the best token fits the grammar. Then the
  // distribution sample() draws from (temperature > 0; temperature, top-k, top-p, min-p applied;
  // sums to 1) over the whole vocabulary, uniform doubles in [0, 1) from the request's
  // generator, and recording an emitted token.
  // Temperatures below 1e-5 pick the argmax, as SGLang's do (1 / T would overflow a float).
  bool greedy() const { return params_.temperature < 1e-5f; }
  bool has_penalties() const {
    return params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f;
  }
  std::span<const float> adjusted(std::span<const float> raw, std::span<const int32_t> path);
  int32_t greedy_at(std::span<const float> raw, std::span<const int32_t> path);
  bool adjusts() const { return has_penalties() || constrained(); }
  void distribution(std::span<const float> logits, std::vector<float>& probs);
  // Whether the token is a function of the raw logits' argmax alone (greedy, no penalties), so a
  // GPU model can find it on the device; take_argmax then records that token (greedy_token's
  // -1 raises sample()'s error).
  bool picks_argmax() const { return greedy() && !has_penalties() && !constrained(); }
  int32_t take_argmax(int32_t token);
  // The same with a grammar: the token is the argmax over the tokens fill_token_bitmask() allows
  // (bits as grammar::TokenConstraint::fill_bitmask), which the host can fill while a GPU runs the
  // forward; take_masked_argmax records it (-1 raises greedy_at's error: nothing fits).
  bool picks_masked_argmax() const { return greedy() && !has_penalties() && constrained(); }
  void fill_token_bitmask(std::span<uint32_t> words) { constraint_->fill_bitmask(words); }
  int32_t take_masked_argmax(int32_t token);
  double uniform();
  // Throws specula::Error when a grammar does not allow the token.
  void record(int32_t token);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_set<int32_t> seen_;                // prompt and output
  std::unordered_map<int32_t, int> output_counts_;  // output only
  std::vector<float> work_;
  std::vector<std::pair<int32_t, int>> pending_counts_;  // penalized()'s path tokens
  std::vector<float> clean_;
  std::unique_ptr<grammar::TokenConstraint> constraint_;
  std::vector<float> masked_;
  std::vector<uint32_t> premask_;  // premask()'s words
  bool premasked_ = false;
  std::vector<float> weights_;  // filter()'s candidate weights, by token id
  std::vector<double> block_sums_;  // pick()'s weights summed per kSoftmaxBlock tokens
  std::vector<int32_t> order_;  // filter()'s candidates (scratch of pick() and distribution())
  std::vector<double> probs_;

  // Penalties only, over the prompt, the recorded output and path (in any order).
  std::span<const float> penalized(std::span<const float> raw, std::span<const int32_t> path);

  int32_t pick(std::span<const float> logits);
  // Logits with NaN as -inf (and only the +inf tokens when any is +inf).
  std::span<const float> clean(std::span<const float> raw);
  // The candidates (ids with a logit above -inf) and their temperature-scaled probabilities;
  // returns how many survive top-k, top-p and min-p, which are the first ones of order. Sorted by
  // falling logit only as far as top-p and min-p need (otherwise in no particular order).
  size_t filter(std::span<const float> logits, std::vector<int32_t>& order, std::vector<double>& probs);
};

// An emitted token's log-probability under the model and the N most likely tokens' (OpenAI's
// logprobs / top_logprobs).
struct TokenLogprobs {
  float logprob = 0;                               // of the emitted token
  std::vector<std::pair<int32_t, float>> top;      // the N most likely, best first (ties: lower id)
};

// The log-softmax of raw logits (NaN as -inf) at `token`, and the top_n largest entries, best
// first (ties: lower id). Computed in double.
std::pair<float, std::vector<std::pair<int32_t, float>>> log_softmax_at(std::span<const float> logits, int32_t token,
                                                                       int top_n);

// The greedy choice over raw logits: the lowest id of the largest value, NaN counting as -inf
// (+inf dominates); -1 when no value is above -inf. One pass, no copy.
int32_t greedy_token(std::span<const float> logits);
// token, or the error a greedy pick over logits with nothing above -inf raises (token -1).
int32_t checked_greedy_token(int32_t token);

}  // namespace specula
