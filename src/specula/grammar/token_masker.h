// Next-token masks with xgrammar's adaptive cache (issue 51): for each stack top the grammar
// reaches, the vocabulary is split once into the tokens that top takes in any context (a bitmask
// ORed in) and the few that depend on the frames below it (checked against the whole stack at
// run time); every other token is refused by that top whatever lies below. A mask then costs a
// few bitmask ORs and those checks instead of a walk of the whole vocabulary trie. Entries are
// computed on first use and kept for the automaton's lifetime, so requests that share a grammar
// share them.
//
// Not thread-safe: one masker is used by one thread at a time (the scheduler's).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "specula/grammar/matcher.h"
#include "specula/grammar/token_constraint.h"

namespace specula::grammar {

class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const Automaton> automaton, std::shared_ptr<const Vocabulary> vocabulary);

  const std::shared_ptr<const Automaton>& automaton() const { return automaton_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }

  // The tokens the grammar accepts after `state` (end tokens aside), in TokenTrie's bitmask layout.
  void fill(const MatchState& state, std::vector<uint32_t>& bitmask);
  // Whether `bytes` are accepted after `state`.
  bool accepts(const MatchState& state, std::string_view bytes) const;
  // Stack tops classified so far.
  size_t cached_tops() const { return cache_.size(); }

 private:
  struct Entry {
    std::vector<uint32_t> accepted;  // bitmask
    std::vector<int32_t> uncertain;  // sorted ids
  };
  const Entry& entry(const Position& top);

  std::shared_ptr<const Automaton> automaton_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  std::unordered_map<uint64_t, Entry> cache_;
};

}  // namespace specula::grammar
