// TokenConstraint.
#include "specula/grammar/token_constraint.h"

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"
#include "specula/grammar/token_masker.h"

namespace specula::grammar {

TokenConstraint::TokenConstraint(std::shared_ptr<TokenMasker> masker, std::vector<int32_t> end_ids)
    : masker_(std::move(masker)), matcher_(masker_->automaton()), vocabulary_(&masker_->vocabulary()),
      end_ids_(std::move(end_ids)) {}

TokenConstraint::TokenConstraint(std::shared_ptr<const Automaton> automaton, std::shared_ptr<const Vocabulary> vocabulary,
                                 std::vector<int32_t> end_ids)
    : TokenConstraint(std::make_shared<TokenMasker>(std::move(automaton), std::move(vocabulary)), std::move(end_ids)) {}

bool TokenConstraint::is_end(int32_t token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end();
}

std::string TokenConstraint::describe(int32_t token) const {
  std::string bytes = token >= 0 && token < vocabulary_->size() ? vocabulary_->tokens[static_cast<size_t>(token)] : "";
  std::string shown;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    shown += b >= 0x20 && b < 0x7F && c != '\'' ? std::string(1, c) : fmt::format("\\x{:02x}", b);
  }
  return fmt::format("token {} ('{}')", token, shown);
}

bool TokenConstraint::allows(int32_t token) const {
  if (ended_) return false;
  if (is_end(token)) return matcher_.can_end();
  if (token < 0 || token >= vocabulary_->size()) return false;
  const std::string& bytes = vocabulary_->tokens[static_cast<size_t>(token)];
  if (bytes.empty()) return false;
  return masker_->accepts(matcher_.state(), bytes);
}

void TokenConstraint::fill_bitmask(std::span<uint32_t> words) {
  std::fill(words.begin(), words.end(), 0u);
  if (ended_) return;
  masker_->fill(matcher_.state(), bitmask_);
  const size_t known = std::min(words.size() * 32, static_cast<size_t>(vocabulary_->size()));
  std::copy_n(bitmask_.begin(), (known + 31) / 32, words.begin());
  if (known % 32 != 0) words[known / 32] &= (1u << (known % 32)) - 1u;
  // End tokens are decided by whether the grammar can end, whatever bytes they stand for.
  const bool end_ok = matcher_.can_end();
  for (int32_t id : end_ids_) {
    if (id < 0 || static_cast<size_t>(id) / 32 >= words.size()) continue;
    const uint32_t bit = 1u << (static_cast<uint32_t>(id) % 32);
    uint32_t& word = words[static_cast<size_t>(id) / 32];
    word = end_ok ? word | bit : word & ~bit;
  }
}

// On x86-64 an AVX2 copy beside the baseline one, chosen at load time: a word's 32 lanes become
// one variable shift and blend per 8.
#if defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
void masked_copy(std::span<const float> logits, std::span<const uint32_t> words, std::span<float> out) {
  SPECULA_ASSERT(out.size() == logits.size() && words.size() * 32 >= logits.size());
  const size_t n = logits.size();
  const size_t whole = n / 32;
  const float* in = logits.data();
  float* o = out.data();
  for (size_t w = 0; w < whole; ++w) {
    const uint32_t bits = words[w];
    for (uint32_t j = 0; j < 32; ++j) o[w * 32 + j] = (bits >> j & 1u) != 0 ? in[w * 32 + j] : -INFINITY;
  }
  for (size_t id = whole * 32; id < n; ++id) o[id] = (words[whole] >> (id % 32) & 1u) != 0 ? in[id] : -INFINITY;
}

void TokenConstraint::mask(std::span<float> logits) {
  allowed_.resize((logits.size() + 31) / 32);
  fill_bitmask(allowed_);
  masked_copy(logits, allowed_, logits);
}

void TokenConstraint::accept(int32_t token) {
  SPECULA_CHECK(allows(token), "grammar: {} does not fit the grammar here (the output so far has {} tokens)",
                describe(token), matcher_.accepted_tokens());
  if (is_end(token)) {
    ended_ = true;
    return;
  }
  matcher_.accept_token(vocabulary_->tokens[static_cast<size_t>(token)]);
  // Only speculative paths roll back, and never past an emitted token.
  matcher_.commit();
}

bool TokenConstraint::push(std::span<const int32_t> path) {
  if (ended_) return path.empty();
  for (size_t i = 0; i < path.size(); ++i) {
    const int32_t t = path[i];
    const bool fits = !is_end(t) && t >= 0 && t < vocabulary_->size() &&
                      !vocabulary_->tokens[static_cast<size_t>(t)].empty() &&
                      matcher_.accept_token(vocabulary_->tokens[static_cast<size_t>(t)]);
    if (!fits) {
      matcher_.rollback(static_cast<int>(i));
      return false;
    }
  }
  return true;
}

}  // namespace specula::grammar
