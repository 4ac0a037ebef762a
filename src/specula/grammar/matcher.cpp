// Automaton and GrammarMatcher.
#include "specula/grammar/matcher.h"

#include <algorithm>
#include <set>
#include <utility>

#include "specula/core/error.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

bool MatchState::operator==(const MatchState& o) const {
  return stacks == o.stacks && partial_len == o.partial_len && partial_need == o.partial_need &&
         std::equal(partial, partial + partial_len, o.partial);
}

Automaton::Automaton(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  SPECULA_CHECK(grammar_ != nullptr && grammar_->root() >= 0, "a grammar automaton needs a compiled grammar");
  const std::vector<Rule>& rules = grammar_->rules();
  offset_.resize(rules.size());
  size_t n = 0;
  for (size_t r = 0; r < rules.size(); ++r) {
    for (const Sequence& seq : rules[r].alternatives) {
      offset_[r].push_back(n);
      n += seq.size() + 1;
    }
  }
  closures_.reserve(n);
  size_t frames = 0;
  for (size_t r = 0; r < rules.size(); ++r) {
    for (size_t a = 0; a < rules[r].alternatives.size(); ++a) {
      for (size_t i = 0; i <= rules[r].alternatives[a].size(); ++i) {
        closures_.push_back(
            compute_closure({static_cast<int32_t>(r), static_cast<int32_t>(a), static_cast<int32_t>(i)}, frames));
      }
    }
  }
}

const Automaton::Closure& Automaton::closure(const Position& p) const {
  return closures_[offset_[static_cast<size_t>(p.rule)][static_cast<size_t>(p.alt)] + static_cast<size_t>(p.index)];
}

Automaton::Closure Automaton::compute_closure(const Position& start, size_t& frames_total) const {
  const std::vector<Rule>& rules = grammar_->rules();
  const auto sequence = [&](const Position& p) -> const Sequence& {
    return rules[static_cast<size_t>(p.rule)].alternatives[static_cast<size_t>(p.alt)];
  };
  Closure c;
  // (position, the frames below it), depth first; a nullable repetition comes back to a pair
  // already met.
  std::set<std::pair<Position, std::vector<Position>>> seen;
  std::vector<std::pair<Position, std::vector<Position>>> todo = {{start, {}}};
  while (!todo.empty()) {
    auto [pos, frames] = std::move(todo.back());
    todo.pop_back();
    bool popped_out = false;
    while (static_cast<size_t>(pos.index) == sequence(pos).size()) {
      if (frames.empty()) {
        popped_out = true;
        break;
      }
      pos = frames.back();
      frames.pop_back();
    }
    if (popped_out) {
      c.pops = true;
      continue;
    }
    if (!seen.insert({pos, frames}).second) continue;
    const Element& e = sequence(pos)[static_cast<size_t>(pos.index)];
    if (e.kind == Element::Kind::kChars) {
      frames.push_back(pos);
      frames_total += frames.size();
      // Checked as it grows: nullable repetitions nested deep ("(a?){1000}") expand
      // quadratically, and the check must come before the time is spent.
      SPECULA_CHECK(frames_total <= kMaxClosureFrames,
                    "grammar: its positions expand to more than {} parse frames (the limit); it nests optional "
                    "parts too deeply, simplify it",
                    kMaxClosureFrames);
      c.entries.push_back(std::move(frames));
      continue;
    }
    SPECULA_CHECK(frames.size() < kMaxDepth, "grammar: a parse is nested more than {} rules deep (the limit)", kMaxDepth);
    // The reference is replaced by what follows it (nothing, for a reference at the end of its
    // alternative, so that repetition, a rule ending by referring to itself, does not grow the
    // stack), and each alternative of the rule goes on top.
    const Position after{pos.rule, pos.alt, pos.index + 1};
    if (static_cast<size_t>(after.index) < sequence(after).size()) frames.push_back(after);
    const Rule& r = rules[static_cast<size_t>(e.rule)];
    for (size_t a = 0; a < r.alternatives.size(); ++a) todo.push_back({{e.rule, static_cast<int32_t>(a), 0}, frames});
  }
  return c;
}

void Automaton::apply(const Position& top, Stack& base, std::vector<Stack>& out, size_t& positions) const {
  const Closure& c = closure(top);
  for (const std::vector<Position>& frames : c.entries) {
    SPECULA_CHECK(base.size() + frames.size() <= kMaxDepth, "grammar: a parse is nested more than {} rules deep (the limit)",
                  kMaxDepth);
    positions += base.size() + frames.size();
    SPECULA_CHECK(positions <= 2 * kMaxPositions,
                  "grammar: its parses hold more than {} positions together (the limit); the grammar is too ambiguous",
                  kMaxPositions);
    Stack& s = out.emplace_back();
    s.reserve(base.size() + frames.size());
    s.assign(base.begin(), base.end());
    s.insert(s.end(), frames.begin(), frames.end());
  }
  SPECULA_CHECK(out.size() <= 2 * kMaxStacks,
                "grammar: more than {} simultaneous parses (the limit); the grammar is too ambiguous", kMaxStacks);
  if (!c.pops) return;
  if (base.empty()) {
    out.emplace_back();
    return;
  }
  const Position below = base.back();
  base.pop_back();
  apply(below, base, out, positions);
  base.push_back(below);
}

void Automaton::normalise(std::vector<Stack>& stacks) const {
  // Any fixed order makes equal states equal; stacks share their bottoms and differ near their
  // tops, so they are compared by size and then from the top.
  std::sort(stacks.begin(), stacks.end(), [](const Stack& a, const Stack& b) {
    if (a.size() != b.size()) return a.size() < b.size();
    return std::lexicographical_compare(a.rbegin(), a.rend(), b.rbegin(), b.rend());
  });
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  SPECULA_CHECK(stacks.size() <= kMaxStacks,
                "grammar: more than {} simultaneous parses (the limit); the grammar is too ambiguous", kMaxStacks);
  size_t positions = 0;
  for (const Stack& s : stacks) positions += s.size();
  SPECULA_CHECK(positions <= kMaxPositions,
                "grammar: its parses hold more than {} positions together (the limit); the grammar is too ambiguous",
                kMaxPositions);
}

MatchState Automaton::start() const {
  MatchState s;
  Stack base;
  size_t positions = 0;
  const Rule& root = grammar_->rules()[static_cast<size_t>(grammar_->root())];
  for (size_t a = 0; a < root.alternatives.size(); ++a) apply({grammar_->root(), static_cast<int32_t>(a), 0}, base, s.stacks, positions);
  normalise(s.stacks);
  return s;
}

namespace {

// Whether the stack's top class holds a code point of [lo, hi] that is not a UTF-16 surrogate
// (which UTF-8 never encodes).
bool top_accepts_any(const Grammar& g, const Stack& stack, uint32_t lo, uint32_t hi) {
  if (stack.empty() || lo > hi) return false;
  const Position& top = stack.back();
  const Element& e = g.rules()[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
  const auto overlaps = [&](uint32_t a, uint32_t b) {
    return a <= b && std::any_of(e.ranges.begin(), e.ranges.end(), [&](const auto& r) { return r.first <= b && a <= r.second; });
  };
  return overlaps(lo, std::min<uint32_t>(hi, 0xD7FF)) || overlaps(std::max<uint32_t>(lo, 0xE000), hi);
}

}  // namespace

bool Automaton::completes_alike(const MatchState& s) const {
  if (s.partial_len == 0 || s.partial_len + 1 != s.partial_need) return false;
  // Named copies: clang 14 (the fuzz build) does not let a lambda capture structured bindings.
  const std::pair<uint32_t, uint32_t> range = utf8_completions(s.partial, s.partial_len, s.partial_need);
  const uint32_t lo = range.first, hi = range.second;
  const std::vector<Rule>& rules = grammar_->rules();
  for (const Stack& st : s.stacks) {
    if (st.empty()) return false;
    const Position& top = st.back();
    const Element& e = rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
    if (std::none_of(e.ranges.begin(), e.ranges.end(), [&](const auto& r) { return r.first <= lo && hi <= r.second; })) {
      return false;
    }
  }
  return true;
}

Automaton::Wide Automaton::takes_wide(const Stack& stack) const {
  if (stack.empty()) return Wide::kNone;
  const Position& top = stack.back();
  const Element& e = grammar_->rules()[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
  if (e.kind != Element::Kind::kChars) return Wide::kSome;
  // Ranges are sorted and disjoint: a span is covered when the range holding its start reaches
  // its end, and missed when no range overlaps it.
  const auto covers = [&](uint32_t lo, uint32_t hi) {
    const auto it = std::lower_bound(e.ranges.begin(), e.ranges.end(), lo,
                                     [](const std::pair<uint32_t, uint32_t>& r, uint32_t c) { return r.second < c; });
    return it != e.ranges.end() && it->first <= lo && it->second >= hi;
  };
  const auto misses = [&](uint32_t lo, uint32_t hi) {
    const auto it = std::lower_bound(e.ranges.begin(), e.ranges.end(), lo,
                                     [](const std::pair<uint32_t, uint32_t>& r, uint32_t c) { return r.second < c; });
    return it == e.ranges.end() || it->first > hi;
  };
  if (covers(0x80, 0xD7FF) && covers(0xE000, 0x10FFFF)) return Wide::kEvery;
  if (misses(0x80, 0xD7FF) && misses(0xE000, 0x10FFFF)) return Wide::kNone;
  return Wide::kSome;
}

bool Automaton::may_take(const MatchState& s, uint8_t byte) const {
  if (s.partial_len > 0) return (byte & 0xC0) == 0x80;
  const int need = utf8_length(byte);
  if (need == 0) return false;
  const std::vector<Rule>& rules = grammar_->rules();
  if (need == 1) {
    return std::any_of(s.stacks.begin(), s.stacks.end(), [&](const Stack& st) {
      if (st.empty()) return false;
      const Position& top = st.back();
      return rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)].matches(byte);
    });
  }
  const std::pair<uint32_t, uint32_t> range = utf8_completions(&byte, 1, need);
  return std::any_of(s.stacks.begin(), s.stacks.end(),
                     [&](const Stack& st) { return top_accepts_any(*grammar_, st, range.first, range.second); });
}

MatchState Automaton::advance(const MatchState& s, uint8_t byte) const {
  MatchState out;
  if (s.dead()) return out;
  uint32_t cp = 0;
  if (s.partial_len == 0) {
    const int need = utf8_length(byte);
    if (need == 0) return out;
    if (need > 1) {
      out.partial[0] = byte;
      out.partial_len = 1;
      out.partial_need = static_cast<uint8_t>(need);
    } else {
      cp = byte;
    }
  } else {
    if ((byte & 0xC0) != 0x80) return out;
    std::copy(s.partial, s.partial + s.partial_len, out.partial);
    out.partial[s.partial_len] = byte;
    out.partial_len = static_cast<uint8_t>(s.partial_len + 1);
    out.partial_need = s.partial_need;
    if (out.partial_len == out.partial_need) {
      const size_t n = decode_utf8(std::string_view(reinterpret_cast<const char*>(out.partial), out.partial_len), cp);
      if (n == 0) return MatchState{};
      out.partial_len = out.partial_need = 0;
    }
  }
  if (out.partial_len > 0) {
    // Half a code point: the stacks wait, as long as one of them could take a completion.
    const auto [lo, hi] = utf8_completions(out.partial, out.partial_len, out.partial_need);
    for (const Stack& st : s.stacks) {
      if (top_accepts_any(*grammar_, st, lo, hi)) out.stacks.push_back(st);
    }
    return out;
  }
  const std::vector<Rule>& rules = grammar_->rules();
  Stack base;
  size_t positions = 0;
  for (const Stack& st : s.stacks) {
    if (st.empty()) continue;
    const Position& top = st.back();
    const Element& e = rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
    if (!e.matches(cp)) continue;
    base.assign(st.begin(), st.end() - 1);
    apply({top.rule, top.alt, top.index + 1}, base, out.stacks, positions);
  }
  normalise(out.stacks);
  return out;
}

MatchState Automaton::resume(Stack base) const {
  MatchState s;
  if (base.empty()) {
    s.stacks.emplace_back();
    return s;
  }
  const Position top = base.back();
  base.pop_back();
  size_t positions = 0;
  apply(top, base, s.stacks, positions);
  normalise(s.stacks);
  return s;
}

bool Automaton::can_end(const MatchState& s) const {
  return s.partial_len == 0 && std::any_of(s.stacks.begin(), s.stacks.end(), [](const Stack& st) { return st.empty(); });
}

bool Automaton::terminated(const MatchState& s) const {
  return s.partial_len == 0 && !s.stacks.empty() &&
         std::all_of(s.stacks.begin(), s.stacks.end(), [](const Stack& st) { return st.empty(); });
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Automaton> automaton)
    : automaton_(std::move(automaton)), state_(automaton_->start()) {}

bool GrammarMatcher::accept_token(std::string_view bytes) {
  MatchState s = state_;
  for (char c : bytes) {
    s = automaton_->advance(s, static_cast<uint8_t>(c));
    if (s.dead()) return false;
  }
  history_.push_back(std::move(state_));
  state_ = std::move(s);
  return true;
}

void GrammarMatcher::rollback(int n) {
  SPECULA_CHECK(n >= 0 && n <= accepted_tokens(), "grammar rollback of {} tokens; {} were accepted", n, accepted_tokens());
  if (n == 0) return;
  state_ = std::move(history_[history_.size() - static_cast<size_t>(n)]);
  history_.resize(history_.size() - static_cast<size_t>(n));
}

}  // namespace specula::grammar
