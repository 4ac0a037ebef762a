// Random sentences (sentence.h).
#include "specula/grammar/sentence.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "specula/model/utf8.h"

namespace specula::grammar {

namespace {

constexpr size_t kInf = SIZE_MAX / 4;

// The shortest sentence of each rule: a fixpoint over lengths where an alternative replaces the
// chosen one only when strictly shorter, so the choices never form a cycle.
class Shortest {
 public:
  explicit Shortest(const Grammar& g) : g_(g), len_(g.rules().size(), kInf), alt_(g.rules().size(), -1) {
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < g.rules().size(); ++r) {
        const auto& alts = g.rules()[r].alternatives;
        for (size_t a = 0; a < alts.size(); ++a) {
          const size_t n = length(alts[a], 0);
          if (n < len_[r]) {
            len_[r] = n;
            alt_[r] = static_cast<int>(a);
            changed = true;
          }
        }
      }
    }
  }

  size_t length(const Sequence& seq, size_t from) const {
    size_t n = 0;
    for (size_t i = from; i < seq.size(); ++i) {
      n = std::min(kInf, n + (seq[i].kind == Element::Kind::kChars ? 1 : len_[static_cast<size_t>(seq[i].rule)]));
    }
    return n;
  }

  void append(const Sequence& seq, size_t from, std::string& out) const {
    for (size_t i = from; i < seq.size(); ++i) {
      const Element& e = seq[i];
      if (e.kind == Element::Kind::kRule) {
        const auto r = static_cast<size_t>(e.rule);
        append(g_.rules()[r].alternatives[static_cast<size_t>(alt_[r])], 0, out);
        continue;
      }
      uint32_t c = e.ranges.front().first;
      for (const auto& [lo, hi] : e.ranges) {
        if (hi >= 0x21) {
          c = std::max<uint32_t>(lo, 0x21);
          break;
        }
      }
      out += utf8_encode(c);
    }
  }

 private:
  const Grammar& g_;
  std::vector<size_t> len_;
  std::vector<int> alt_;
};

}  // namespace

std::vector<std::string> sentence_letters() {
  std::vector<std::string> l;
  for (char c = 0x20; c < 0x7F; ++c) l.emplace_back(1, c);
  for (const char* extra : {"\n", "\xC3\xA9", "\xE4\xB8\x96", "\xF0\x9F\x98\x80"}) l.emplace_back(extra);
  return l;
}

std::string shortest_completion(const Automaton& automaton, const MatchState& state) {
  const Shortest shortest(automaton.grammar());
  const auto& rules = automaton.grammar().rules();
  const auto sequence = [&](const Position& p) -> const Sequence& {
    return rules[static_cast<size_t>(p.rule)].alternatives[static_cast<size_t>(p.alt)];
  };
  std::string best;
  size_t best_len = kInf;
  for (const Stack& st : state.stacks) {
    size_t n = 0;
    for (const Position& p : st) n = std::min(kInf, n + shortest.length(sequence(p), static_cast<size_t>(p.index)));
    if (n >= best_len) continue;
    best_len = n;
    best.clear();
    for (size_t f = st.size(); f-- > 0;) shortest.append(sequence(st[f]), static_cast<size_t>(st[f].index), best);
  }
  return best;
}

std::string random_sentence(const Automaton& automaton, std::mt19937& rng, int max_letters,
                            const std::vector<std::string>& letters) {
  MatchState st = automaton.start();
  std::string s;
  for (int steps = 0; steps < max_letters; ++steps) {
    if (automaton.can_end(st) && rng() % 3 == 0) return s;
    std::vector<std::pair<const std::string*, MatchState>> options;
    for (const std::string& l : letters) {
      MatchState t = st;
      for (char c : l) t = automaton.advance(t, static_cast<uint8_t>(c));
      if (!t.dead()) options.emplace_back(&l, std::move(t));
    }
    if (options.empty()) break;
    auto& pick = options[rng() % options.size()];
    s += *pick.first;
    st = std::move(pick.second);
  }
  return s + shortest_completion(automaton, st);
}

}  // namespace specula::grammar
