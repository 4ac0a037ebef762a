// What the grammar tests share: whole-text acceptance, random texts over a letter set, and
// sentences walked out of an automaton.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "specula/core/error.h"
#include "specula/grammar/matcher.h"

namespace specula::grammar::testing {

// The one-line error compiling `source` with `compile` raises, or "(no error)".
template <typename Compile>
std::string error_text(Compile compile, const std::string& source) {
  try {
    compile(source);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Whether the whole of s is a sentence of the automaton's grammar, fed byte by byte.
inline bool accepts(const Automaton& a, const std::string& s) {
  MatchState st = a.start();
  for (char c : s) {
    st = a.advance(st, static_cast<uint8_t>(c));
    if (st.dead()) return false;
  }
  return a.can_end(st);
}

// Up to max_letters random letters.
inline std::string random_text(const std::vector<std::string>& letters, std::mt19937& rng, int max_letters) {
  std::string s;
  const int n = static_cast<int>(rng() % static_cast<unsigned>(max_letters + 1));
  for (int i = 0; i < n; ++i) s += letters[rng() % letters.size()];
  return s;
}

// A random walk of the automaton: at each step a random letter among those that keep a parse
// alive, stopping (with chance 1/3) where it may end, or after max_steps letters.
inline std::string random_sentence(const Automaton& a, const std::vector<std::string>& letters, std::mt19937& rng,
                                   int max_steps) {
  MatchState st = a.start();
  std::string s;
  for (int steps = 0; steps < max_steps; ++steps) {
    if (a.can_end(st) && rng() % 3 == 0) break;
    std::vector<std::pair<std::string, MatchState>> options;
    for (const std::string& l : letters) {
      MatchState t = st;
      for (char c : l) t = a.advance(t, static_cast<uint8_t>(c));
      if (!t.dead()) options.emplace_back(l, std::move(t));
    }
    if (options.empty()) break;
    auto& pick = options[rng() % options.size()];
    s += pick.first;
    st = std::move(pick.second);
  }
  return s;
}

}  // namespace specula::grammar::testing
