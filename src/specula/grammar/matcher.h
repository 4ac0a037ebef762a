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

// The automaton's transitions (no state of their own; immutable after construction, so one
// automaton may serve many matchers on many threads).
class Automaton {
 public:
  // Precomputes every position's closure (below); throws specula::Error when they exceed
  // kMaxClosureFrames.
  explicit Automaton(std::shared_ptr<const Grammar> grammar);
  const Grammar& grammar() const { return *grammar_; }
  // Before any input.
  MatchState start() const;
  // After one more byte; dead() when no parse accepts it.
  MatchState advance(const MatchState& s, uint8_t byte) const;
  // False when advance(s, byte) is certainly dead, decided from the stacks' tops alone without
  // building a state: most bytes die at once, and a mask walk meets each of them at its root.
  bool may_take(const MatchState& s, uint8_t byte) const;
  // A finished parse, no code point half read.
  bool can_end(const MatchState& s) const;
  // Nothing but the end can follow.
  bool terminated(const MatchState& s) const;
  // A state one byte short of a code point whose stacks each take every code point that byte can
  // complete (inside a JSON string, any non-ASCII character): the partial bytes then decide
  // nothing about what follows, so such states may be treated as one.
  bool completes_alike(const MatchState& s) const;
  // Which code points past ASCII a stack's top class takes: every one (a JSON string's body, `.`),
  // none, or some. When each stack takes every one or none, every such code point leads to the
  // same state.
  enum class Wide : uint8_t { kNone, kEvery, kSome };
  Wide takes_wide(const Stack& stack) const;
  // The state where `base` goes on after the frames that stood above it finished: its top frame
  // (a return position) continues. An empty base: the parse is complete.
  MatchState resume(Stack base) const;

  // Limits on the work of one step: the stacks a state holds, their depth, and the positions
  // they hold together. A grammar or input that exceeds them (ambiguity that multiplies parses,
  // nesting without end) fails with an error naming the limit, never a hang.
  static constexpr size_t kMaxStacks = 256;
  static constexpr size_t kMaxDepth = 512;
  static constexpr size_t kMaxPositions = 1 << 13;
  // The precomputed closures' total size.
  static constexpr size_t kMaxClosureFrames = 1 << 18;

 private:
  // A position's closure: the stack tops reachable from it without consuming input. Each entry
  // replaces the position's frame by `frames` (bottom to top; the top a character class); `pops`
  // when the rest of the position's alternative can match nothing, so that the frame below
  // continues (its own closure then applies).
  struct Closure {
    std::vector<std::vector<Position>> entries;
    bool pops = false;
  };
  const Closure& closure(const Position& p) const;
  // frames_total: the frames of every closure so far, against kMaxClosureFrames.
  Closure compute_closure(const Position& p, size_t& frames_total) const;
  // Adds closure(top) on top of `base` (the stack below the position) to out; positions counts
  // what out holds (before duplicates go), against kMaxPositions.
  void apply(const Position& top, Stack& base, std::vector<Stack>& out, size_t& positions) const;
  void normalise(std::vector<Stack>& stacks) const;

  std::shared_ptr<const Grammar> grammar_;
  // closures_[offset_[rule] + alt_offset + index], index in [0, size] of each alternative.
  std::vector<std::vector<size_t>> offset_;
  std::vector<Closure> closures_;
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
  // Forgets the states kept for rollback: what was accepted so far stays.
  void commit() { history_.clear(); }
  int accepted_tokens() const { return static_cast<int>(history_.size()); }
  bool can_end() const { return automaton_->can_end(state_); }
  bool terminated() const { return automaton_->terminated(state_); }

 private:
  std::shared_ptr<const Automaton> automaton_;
  MatchState state_;
  std::vector<MatchState> history_;  // the state before each accepted token
};

}  // namespace specula::grammar
