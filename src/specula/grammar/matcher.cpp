// Automaton and GrammarMatcher.
#include "specula/grammar/matcher.h"

#include <algorithm>

#include "specula/core/error.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

bool MatchState::operator==(const MatchState& o) const {
  return stacks == o.stacks && partial_len == o.partial_len && partial_need == o.partial_need &&
         std::equal(partial, partial + partial_len, o.partial);
}

Automaton::Automaton(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  SPECULA_CHECK(grammar_ != nullptr && grammar_->root() >= 0, "a grammar automaton needs a compiled grammar");
}

void Automaton::expand(Stack stack, std::vector<Stack>& out) const {
  std::vector<Stack> seen;
  expand(std::move(stack), out, seen);
}

void Automaton::expand(Stack stack, std::vector<Stack>& out, std::vector<Stack>& seen) const {
  const std::vector<Rule>& rules = grammar_->rules();
  // Finished alternatives pop back to what follows their rule reference.
  while (!stack.empty()) {
    const Position& top = stack.back();
    const Sequence& seq = rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)];
    if (static_cast<size_t>(top.index) < seq.size()) break;
    stack.pop_back();
  }
  if (std::find(seen.begin(), seen.end(), stack) != seen.end()) return;
  seen.push_back(stack);
  if (stack.empty()) {
    out.push_back(std::move(stack));
    return;
  }
  const Position top = stack.back();
  const Element& e = rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
  if (e.kind == Element::Kind::kChars) {
    out.push_back(std::move(stack));
    return;
  }
  SPECULA_CHECK(stack.size() < kMaxDepth, "grammar: a parse is nested more than {} rules deep (the limit)", kMaxDepth);
  // The reference is replaced by what follows it (nothing, for a reference at the end of its
  // alternative: so that repetition, a rule that ends by referring to itself, does not grow the
  // stack), and each alternative of the rule goes on top.
  stack.back().index += 1;
  if (static_cast<size_t>(stack.back().index) ==
      rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)].size()) {
    stack.pop_back();
  }
  const Rule& r = rules[static_cast<size_t>(e.rule)];
  for (size_t a = 0; a < r.alternatives.size(); ++a) {
    Stack next = stack;
    next.push_back({e.rule, static_cast<int32_t>(a), 0});
    expand(std::move(next), out, seen);
    SPECULA_CHECK(out.size() <= 4 * kMaxStacks, "grammar: more than {} simultaneous parses (the limit)", kMaxStacks);
  }
}

void Automaton::normalise(std::vector<Stack>& stacks) const {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  SPECULA_CHECK(stacks.size() <= kMaxStacks, "grammar: more than {} simultaneous parses (the limit)", kMaxStacks);
}

MatchState Automaton::start() const {
  MatchState s;
  const Rule& root = grammar_->rules()[static_cast<size_t>(grammar_->root())];
  for (size_t a = 0; a < root.alternatives.size(); ++a) expand(Stack{{grammar_->root(), static_cast<int32_t>(a), 0}}, s.stacks);
  normalise(s.stacks);
  return s;
}

namespace {

// The code points a partial sequence can still become: its bytes followed by the smallest and the
// largest continuation bytes.
std::pair<uint32_t, uint32_t> completions(const uint8_t* bytes, int len, int need) {
  uint32_t lo = bytes[0] & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07), hi = lo;
  for (int i = 1; i < need; ++i) {
    const uint32_t b = i < len ? bytes[i] & 0x3F : 0;
    lo = (lo << 6) | b;
    hi = (hi << 6) | (i < len ? bytes[i] & 0x3F : 0x3F);
  }
  return {lo, std::min<uint32_t>(hi, 0x10FFFF)};
}

bool top_accepts_any(const Grammar& g, const Stack& stack, uint32_t lo, uint32_t hi) {
  if (stack.empty()) return false;
  const Position& top = stack.back();
  const Element& e = g.rules()[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
  return std::any_of(e.ranges.begin(), e.ranges.end(), [&](const auto& r) { return r.first <= hi && lo <= r.second; });
}

}  // namespace

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
    const auto [lo, hi] = completions(out.partial, out.partial_len, out.partial_need);
    for (const Stack& st : s.stacks) {
      if (top_accepts_any(*grammar_, st, lo, hi)) out.stacks.push_back(st);
    }
    return out;
  }
  const std::vector<Rule>& rules = grammar_->rules();
  for (const Stack& st : s.stacks) {
    if (st.empty()) continue;
    const Position& top = st.back();
    const Element& e = rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
    if (!e.matches(cp)) continue;
    Stack next = st;
    next.back().index += 1;
    expand(std::move(next), out.stacks);
  }
  normalise(out.stacks);
  return out;
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
