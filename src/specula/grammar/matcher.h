// The grammar's pushdown automaton over bytes (issue 51): a set of stacks of grammar positions
// (llama.cpp's GBNF matcher keeps the same shape), each stack's top the character class the next
// code point must match, an empty stack a finished parse. Bytes are fed one at a time, so a token
// may end inside a multi-byte code point: the partial sequence is kept and must stay completable.
//
// GrammarMatcher: accept a token (all or nothing), roll back the last n tokens (what speculative
// verification needs), whether end-of-sequence is allowed, and the mask of every vocabulary token
// the grammar accepts next (token_mask.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "specula/grammar/grammar.h"

namespace specula::grammar {

// A grammar position: element `index` of alternative `alt` of rule `rule`.
struct Position {
  int32_t rule = 0, alt = 0, index = 0;
  bool operator==(const Position&) const = default;
  auto operator<=>(const Position&) const = default;
};

using Stack = std::vector<Position>;  // back(): the next element to match

struct MatchState {
  std::vector<Stack> stacks;  // sorted, distinct; empty: no parse survives
  uint8_t partial[4] = {};    // bytes of an unfinished code point
  uint8_t partial_len = 0, partial_need = 0;
  bool operator==(const MatchState& o) const;
  bool dead() const { return stacks.empty(); }
};

// The automaton's transitions (no state of their own).
class Automaton {
 public:
  explicit Automaton(std::shared_ptr<const Grammar> grammar);
  const Grammar& grammar() const { return *grammar_; }
  // Before any input.
  MatchState start() const;
  // After one more byte; dead() when no parse accepts it.
  MatchState advance(const MatchState& s, uint8_t byte) const;
  // A finished parse, no code point half read.
  bool can_end(const MatchState& s) const;
  // Nothing but the end can follow.
  bool terminated(const MatchState& s) const;

  // Limits on the work of one step: the stacks a state holds and their depth. A grammar that
  // exceeds them (ambiguity that multiplies parses) fails with an error naming the limit.
  static constexpr size_t kMaxStacks = 4096;
  static constexpr size_t kMaxDepth = 4096;

 private:
  // Expands `stack` until its top is a character class (or it is empty) into out. seen: the
  // stacks this expansion met already (a nullable repetition comes back to the same stack).
  void expand(Stack stack, std::vector<Stack>& out) const;
  void expand(Stack stack, std::vector<Stack>& out, std::vector<Stack>& seen) const;
  void normalise(std::vector<Stack>& stacks) const;

  std::shared_ptr<const Grammar> grammar_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Automaton> automaton);

  const Automaton& automaton() const { return *automaton_; }
  const MatchState& state() const { return state_; }
  // Feeds a token's bytes; false (and no change) when the grammar rejects them.
  bool accept_token(std::string_view bytes);
  // Undoes the last n accepted tokens (n <= accepted_tokens()).
  void rollback(int n);
  int accepted_tokens() const { return static_cast<int>(history_.size()); }
  bool can_end() const { return automaton_->can_end(state_); }
  bool terminated() const { return automaton_->terminated(state_); }

 private:
  std::shared_ptr<const Automaton> automaton_;
  MatchState state_;
  std::vector<MatchState> history_;  // the state before each accepted token
};

}  // namespace specula::grammar
