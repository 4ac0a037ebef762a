// A grammar as the sampler applies it to one request (issue 51): which vocabulary tokens may come
// next, end-of-sequence only where the grammar can end, the emitted tokens fed to the matcher, and
// a speculative tree path pushed and popped to ask the same question at a draft node.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specula/grammar/matcher.h"
#include "specula/grammar/token_mask.h"

namespace specula::grammar {

// The vocabulary's bytes once per tokenizer, shared by every constrained request.
struct Vocabulary {
  // tokens[id]: the bytes the token stands for; empty for special tokens and ids the tokenizer
  // does not have, which a grammar never produces.
  explicit Vocabulary(std::vector<std::string> tokens_) : tokens(std::move(tokens_)), trie(tokens) {}
  std::vector<std::string> tokens;
  TokenTrie trie;
  int size() const { return static_cast<int>(tokens.size()); }
};

class TokenMasker;

// out[i] = logits[i] where bit i of words is set (token id i: bit i % 32 of words[i / 32]), -inf
// elsewhere; out may be logits itself. Vectorised (a 128k-token row in a few microseconds).
void masked_copy(std::span<const float> logits, std::span<const uint32_t> words, std::span<float> out);

class TokenConstraint {
 public:
  // end_ids: the tokens that end the sequence (EOS and stop tokens); allowed where the grammar
  // can end. The masker (token_masker.h) may be shared by requests of the same grammar.
  TokenConstraint(std::shared_ptr<TokenMasker> masker, std::vector<int32_t> end_ids);
  TokenConstraint(std::shared_ptr<const Automaton> automaton, std::shared_ptr<const Vocabulary> vocabulary,
                  std::vector<int32_t> end_ids);

  // Whether `token` may come next.
  bool allows(int32_t token) const;
  // Sets the logit of every token that may not come next to -inf (logits: one per vocabulary id).
  void mask(std::span<float> logits);
  // The tokens that may come next as bits (token id i: bit i % 32 of words[i / 32]), over as many
  // ids as words hold; ids the vocabulary lacks are never allowed. What mask() keeps.
  void fill_bitmask(std::span<uint32_t> words);
  // Advances over an emitted token; throws specula::Error naming the token when the grammar does
  // not allow it. After an end token nothing more is allowed.
  void accept(int32_t token);
  // Nothing but an end token can follow.
  bool terminated() const { return ended_ || matcher_.terminated(); }
  // The state after a speculative tree path (tokens in order): false, with nothing pushed, when
  // the grammar rejects one of them (a node no accepted path can reach) or one is an end token.
  bool push(std::span<const int32_t> path);
  void pop(size_t n) { matcher_.rollback(static_cast<int>(n)); }

 private:
  bool is_end(int32_t token) const;
  std::string describe(int32_t token) const;

  std::shared_ptr<TokenMasker> masker_;
  GrammarMatcher matcher_;
  const Vocabulary* vocabulary_;
  std::vector<int32_t> end_ids_;
  std::vector<uint32_t> bitmask_;  // the masker's bits
  std::vector<uint32_t> allowed_;  // mask()'s bits over the logits
  bool ended_ = false;
};

}  // namespace specula::grammar
