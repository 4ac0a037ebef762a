// TokenTrie's walks (token_mask.cpp, token_classify.cpp; internal to the grammar engine): the
// automaton's states a walk meets, interned with their transitions, and chains of code points.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "specula/core/error.h"
#include "specula/grammar/token_mask.h"

namespace specula::grammar {

// The longest chain followed (Transitions::chain); a chain that comes back to its state goes on
// for ever.
constexpr int kMaxChain = 255;

// A chain of code points from state `home` (Transitions::chain). Levels count from 1 (the first
// code point); a chain that loops repeats its last computed level.
struct TokenTrie::Chain {
  int32_t home;
  int count;    // levels computed
  bool loops;   // the last computed level leads back to its own state
  const int32_t* states_;                 // states_[i]: after i + 1 code points
  const std::array<uint64_t, 2>* level_;  // level_[i]: the ASCII bytes of code point i + 1
  const std::array<uint64_t, 2>* masks_;  // masks_[i]: level_[0] & ... & level_[i]
  const uint8_t* wide_;                   // wide_[i]: non-ASCII code points lead along at level i + 1
  const uint8_t* wide_all_;               // wide_all_[i]: wide_[0] && ... && wide_[i]
  // Whether it ended (not by looping or at kMaxChain); the ASCII bytes its last state refuses in
  // every parse, and whether that state refuses every non-ASCII code point too.
  bool ended;
  std::array<uint64_t, 2> end_refused;
  bool end_wide_dead;

  int levels() const { return loops ? kMaxChain : count; }
  size_t at(int i) const { return static_cast<size_t>(std::min(i, count) - 1); }
  const std::array<uint64_t, 2>& level(int i) const { return level_[at(i)]; }
  const std::array<uint64_t, 2>& mask(int i) const { return masks_[at(i)]; }
  bool wide(int i) const { return wide_[at(i)] != 0; }
  bool wide_all(int i) const { return wide_all_[at(i)] != 0; }
  int32_t state(int i) const { return i == 0 ? home : states_[at(i)]; }
};

// The walks meet few distinct states (inside a JSON string every character leads back to the same
// one), so a walk interns its states and computes each (state, byte) transition once: a trie node
// then costs a table lookup rather than an automaton step.
class TokenTrie::Transitions {
 public:
  // split: an empty stack (a finished parse) is reported by step() and kept out of the states.
  Transitions(const Automaton& automaton, bool split) : automaton_(automaton), split_(split) {}

  struct Step {
    int32_t next = -1;  // -1: no parse survives
    bool finished = false;
  };

  int32_t intern(MatchState s) {
    if (s.dead()) return -1;
    // States that differ only in the bytes of a code point their stacks all take alike are one:
    // inside a string, the thousand-odd two-byte prefixes of CJK characters would otherwise each
    // be a state of their own.
    MatchState key = s;
    if (automaton_.completes_alike(key)) std::fill(std::begin(key.partial), std::end(key.partial), uint8_t{0});
    const size_t h = hash(key);
    for (auto [it, end] = index_.equal_range(h); it != end; ++it) {
      if (keys_[static_cast<size_t>(it->second)] == key) return it->second;
    }
    const auto id = static_cast<int32_t>(states_.size());
    work_ += s.stacks.size() + 1;
    SPECULA_CHECK(work_ <= kMaxMaskWork,
                  "grammar: the next-token mask needs more than {} parse steps (the limit); the grammar is too ambiguous",
                  kMaxMaskWork);
    SPECULA_CHECK(states_.size() < kMaxStates,
                  "grammar: the next-token mask meets more than {} distinct parse states (the limit); the grammar "
                  "branches too much (a very large enum?)",
                  kMaxStates);
    states_.push_back(std::move(s));
    keys_.push_back(std::move(key));
    index_.emplace(h, id);
    steps_.resize(steps_.size() + 256, kUnknown);
    return id;
  }

  Step step(int32_t from, uint8_t byte) {
    const size_t slot = static_cast<size_t>(from) * 256 + byte;
    if (steps_[slot] != kUnknown) return {steps_[slot] / 2 - 1, (steps_[slot] & 1) != 0};
    if (!automaton_.may_take(states_[static_cast<size_t>(from)], byte)) {
      steps_[slot] = 0;  // dead, not finished
      return {};
    }
    MatchState next = automaton_.advance(states_[static_cast<size_t>(from)], byte);
    Step out;
    if (split_) {
      const auto ended = std::remove_if(next.stacks.begin(), next.stacks.end(), [](const Stack& st) { return st.empty(); });
      out.finished = ended != next.stacks.end();
      next.stacks.erase(ended, next.stacks.end());
    }
    out.next = intern(std::move(next));
    // intern() may have grown the table: index it again.
    steps_[slot] = (out.next + 1) * 2 + (out.finished ? 1 : 0);
    return out;
  }

  // 1 KiB of transitions per state: 64 MiB at most.
  static constexpr size_t kMaxStates = 1 << 16;

  // The ASCII bytes that lead from a state exactly where `byte` does: those the same stacks' top
  // character classes take (an ASCII byte is a whole code point, and the stacks that take it
  // decide the next state). Empty when the state waits for the rest of a code point or nothing
  // takes `byte`. Computed once per state.
  std::array<uint64_t, 2> alike(int32_t state, uint8_t byte) {
    if (classes_.size() <= static_cast<size_t>(state)) classes_.resize(states_.size());
    Classes& c = classes_[static_cast<size_t>(state)];
    if (c.masks.empty()) fill_classes(states_[static_cast<size_t>(state)], c);
    return c.cls[byte] < 0 ? std::array<uint64_t, 2>{} : c.masks[static_cast<size_t>(c.cls[byte])];
  }

  // The ASCII bytes that, at each of the first `levels` steps of repeating `byte` from `state`,
  // lead where `byte` leads, that path staying alive and inside the frames throughout; none when
  // it finishes or dies sooner. Memoized per (state, byte), so a walk pays O(1) per trie node.
  std::array<uint64_t, 2> alike_run(int32_t state, uint8_t byte, int levels) {
    const size_t slot = static_cast<size_t>(state) * 256 + byte;
    if (run_of_.size() <= slot) run_of_.resize(steps_.size(), -1);
    if (run_of_[slot] < 0) {
      run_of_[slot] = static_cast<int32_t>(runs_.size());
      runs_.emplace_back();
    }
    // alike() and step() below leave runs_ alone, so the reference stays valid.
    Run& r = runs_[static_cast<size_t>(run_of_[slot])];
    while (static_cast<int>(r.masks.size()) < levels && !r.ended) {
      const int32_t from = r.masks.empty() ? state : r.last;
      const std::array<uint64_t, 2> same = alike(from, byte);
      const Step st = step(from, byte);
      if ((same[0] | same[1]) == 0 || st.finished || st.next < 0) {
        r.ended = true;
        break;
      }
      r.masks.push_back(r.masks.empty() ? same : std::array<uint64_t, 2>{r.masks.back()[0] & same[0], r.masks.back()[1] & same[1]});
      r.last = st.next;
    }
    return static_cast<int>(r.masks.size()) >= levels ? r.masks[static_cast<size_t>(levels - 1)] : std::array<uint64_t, 2>{};
  }

  // Chains of code points (TokenTrie::chain_walk): from a boundary state `home`, each non-ASCII
  // code point leads to one state, alive and with no parse finished, and so do the chain's ASCII
  // bytes at that level (chain()). chain_home: a state's boundary (itself, or where it finishes the code
  // point it is half-way through), -1 when there is none. Memoized per state.
  int32_t chain_home(int32_t state) {
    if (home_.size() <= static_cast<size_t>(state)) home_.resize(states_.size(), kNoHome);
    if (home_[static_cast<size_t>(state)] == kNoHome) home_[static_cast<size_t>(state)] = find_home(state);
    return home_[static_cast<size_t>(state)];
  }
  // Extends the chain from `home` to `levels` code points or to its end; the levels it has.
  int chain_extend(int32_t home, int levels) {
    levels = std::min(levels, kMaxChain);
    if (wide_runs_.size() <= static_cast<size_t>(home)) wide_runs_.resize(states_.size());
    while (static_cast<int>(wide_runs_[static_cast<size_t>(home)].states.size()) < levels &&
           !wide_runs_[static_cast<size_t>(home)].ended && !wide_runs_[static_cast<size_t>(home)].loops) {
      const WideRun& r = wide_runs_[static_cast<size_t>(home)];
      const int32_t from = r.states.empty() ? home : r.states.back();
      std::array<uint64_t, 2> same{};
      bool wide = false;
      // wide_step() may intern states but never grows wide_runs_, so r stays valid across it.
      const int32_t next = wide_step(from, same, wide);
      // A chain is a run of one class: it ends where the class changes (a literal's letters, a
      // count's last character before what follows), which keeps it short and its ends clean.
      const bool changes = !r.level.empty() && (same != r.level.back() || wide != (r.wide.back() != 0));
      if (next < 0 || changes) {
        const std::array<uint64_t, 2> refused = refused_by(from);
        bool wide_dead = true;
        for (const Stack& st : states_[static_cast<size_t>(from)].stacks) {
          wide_dead = wide_dead && automaton_.takes_wide(st) == Automaton::Wide::kNone;
        }
        WideRun& w = wide_runs_[static_cast<size_t>(home)];
        w.ended = true;
        w.end_refused = refused;
        w.end_wide_dead = wide_dead;
        break;
      }
      WideRun& w = wide_runs_[static_cast<size_t>(home)];
      w.masks.push_back(w.masks.empty() ? same : std::array<uint64_t, 2>{w.masks.back()[0] & same[0], w.masks.back()[1] & same[1]});
      w.level.push_back(same);
      w.states.push_back(next);
      w.wide_all.push_back(wide && (w.wide.empty() || w.wide_all.back() != 0) ? 1 : 0);
      w.wide.push_back(wide ? 1 : 0);
      w.loops = next == from;
    }
    const WideRun& r = wide_runs_[static_cast<size_t>(home)];
    return r.loops ? kMaxChain : static_cast<int>(r.states.size());
  }
  // The whole chain from `home` (up to kMaxChain levels), as arrays a walk reads directly: they
  // stay where they are while the walk goes on, since the chain grows no further and a move of
  // wide_runs_ moves the vectors' buffers with them.
  Chain chain(int32_t home) {
    chain_extend(home, kMaxChain);
    const WideRun& r = wide_runs_[static_cast<size_t>(home)];
    return {home,          static_cast<int>(r.states.size()), r.loops, r.states.data(), r.level.data(), r.masks.data(),
            r.wide.data(), r.wide_all.data(), r.ended, r.end_refused, r.end_wide_dead};
  }
  // Whether the chain from `home` has a first level through every non-ASCII code point.
  bool wide_first(int32_t home) {
    return chain_extend(home, 1) >= 1 && wide_runs_[static_cast<size_t>(home)].wide[0] != 0;
  }
  // The continuation bytes a state half-way through a code point still needs.
  int pending(int32_t state) const {
    const MatchState& s = states_[static_cast<size_t>(state)];
    return s.partial_need - s.partial_len;
  }

  // The ASCII bytes that, at each of the first `levels` code points of the chain from `state`,
  // lead along it; none when the chain is shorter.
  std::array<uint64_t, 2> wide_run(int32_t state, int levels) {
    const int32_t home = chain_home(state);
    if (home < 0 || chain_extend(home, levels) < levels) return {};
    const WideRun& r = wide_runs_[static_cast<size_t>(home)];
    const auto i = static_cast<size_t>(std::min(levels, static_cast<int>(r.states.size())) - 1);
    return r.wide_all[i] != 0 ? r.masks[i] : std::array<uint64_t, 2>{};
  }

 private:
  // A state's code-point boundary: itself, or for a state inside a code point whose stacks all
  // take every non-ASCII code point, the state after it (the same whichever one it becomes).
  int32_t find_home(int32_t state) {
    if (states_[static_cast<size_t>(state)].partial_len == 0) return state;
    for (const Stack& st : states_[static_cast<size_t>(state)].stacks) {
      if (automaton_.takes_wide(st) != Automaton::Wide::kEvery) return -1;
    }
    MatchState boundary;
    boundary.stacks = states_[static_cast<size_t>(state)].stacks;
    const int32_t from = intern(std::move(boundary));
    if (from < 0) return -1;
    const Step lead = step(from, kWideLead);
    if (lead.next < 0) return -1;
    const Step done = step(lead.next, kWideTail);
    return done.finished ? -1 : done.next;
  }

  // From boundary state h: the state every non-ASCII code point leads to, alive and with no parse
  // finished, and in `same` the ASCII bytes that lead there too; -1 when there is no such state.
  // `wide` tells which: through every non-ASCII code point (and the ASCII bytes that lead where
  // they do), or, where no stack takes one, through the largest class of ASCII bytes.
  int32_t wide_step(int32_t h, std::array<uint64_t, 2>& same, bool& wide) {
    // Every stack takes every non-ASCII code point or none.
    std::vector<uint8_t> every;
    for (const Stack& st : states_[static_cast<size_t>(h)].stacks) {
      const Automaton::Wide w = automaton_.takes_wide(st);
      if (w == Automaton::Wide::kSome) return -1;
      every.push_back(w == Automaton::Wide::kEvery ? 1 : 0);
    }
    wide = std::find(every.begin(), every.end(), 1) != every.end();
    if (classes_.size() <= static_cast<size_t>(h)) classes_.resize(states_.size());
    if (classes_[static_cast<size_t>(h)].masks.empty()) fill_classes(states_[static_cast<size_t>(h)], classes_[static_cast<size_t>(h)]);
    const std::vector<Rule>& rules = automaton_.grammar().rules();
    int rep_alike = -1;
    int largest = 0;
    for (const std::array<uint64_t, 2>& bytes : classes_[static_cast<size_t>(h)].masks) {
      if ((bytes[0] | bytes[1]) == 0) continue;
      const int rep = bytes[0] != 0 ? __builtin_ctzll(bytes[0]) : 64 + __builtin_ctzll(bytes[1]);
      if (!wide) {
        const int size = __builtin_popcountll(bytes[0]) + __builtin_popcountll(bytes[1]);
        if (size > largest) {
          largest = size;
          same = bytes;
          rep_alike = rep;
        }
        continue;
      }
      // ASCII bytes taken by exactly the stacks that take non-ASCII code points lead where such a
      // code point leads (the next state is what the taking stacks' closures make).
      bool alike = true;
      const std::vector<Stack>& stacks = states_[static_cast<size_t>(h)].stacks;
      for (size_t k = 0; k < stacks.size() && alike; ++k) {
        const Position& top = stacks[k].back();
        const Element& e = rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
        alike = (e.kind == Element::Kind::kChars && e.matches(static_cast<uint32_t>(rep))) == (every[k] != 0);
      }
      if (!alike) continue;
      same[0] |= bytes[0];
      same[1] |= bytes[1];
      rep_alike = rep;
    }
    // The next state: through an ASCII byte that leads there when there is one (one transition
    // instead of two).
    Step done;
    if (rep_alike >= 0) {
      done = step(h, static_cast<uint8_t>(rep_alike));
    } else if (wide) {
      const Step lead = step(h, kWideLead);
      if (lead.next >= 0) done = step(lead.next, kWideTail);
    }
    if (done.next < 0 || done.finished) {
      same = {};
      return -1;
    }
    return done.next;
  }

  // U+00A0 (C2 A0): a code point past ASCII standing for all of them.
  static constexpr uint8_t kWideLead = 0xC2, kWideTail = 0xA0;

  static size_t hash(const MatchState& s) {
    size_t h = s.partial_len * 31u + s.partial_need;
    for (int i = 0; i < s.partial_len; ++i) h = h * 131u + s.partial[i];
    for (const Stack& st : s.stacks) {
      h = h * 1000003u + st.size();
      for (const Position& p : st) h = (h * 1000003u) ^ static_cast<size_t>(p.rule * 65599 + p.alt * 257 + p.index);
    }
    return h;
  }

  struct Classes {
    std::array<int16_t, 128> cls{};               // class of each ASCII byte; -1: no stack takes it
    std::vector<std::array<uint64_t, 2>> masks;  // each class's bytes
  };

  void fill_classes(const MatchState& s, Classes& c) const {
    c.cls.fill(-1);
    c.masks.assign(1, {0, 0});  // a placeholder so that an empty result is computed once
    if (s.partial_len > 0) return;
    // Which stacks take each ASCII byte, one bit per stack, from the ranges of each top class.
    using Signature = std::array<uint64_t, (Automaton::kMaxStacks + 63) / 64>;
    SPECULA_ASSERT(s.stacks.size() <= Automaton::kMaxStacks, "a state of {} stacks", s.stacks.size());
    std::array<Signature, 128> sig{};
    const std::vector<Rule>& rules = automaton_.grammar().rules();
    for (size_t k = 0; k < s.stacks.size(); ++k) {
      const Position& top = s.stacks[k].back();
      const Element& e = rules[static_cast<size_t>(top.rule)].alternatives[static_cast<size_t>(top.alt)][static_cast<size_t>(top.index)];
      if (e.kind != Element::Kind::kChars) continue;
      for (const auto& [lo, hi] : e.ranges) {
        for (uint32_t b = lo; b <= hi && b < 128; ++b) sig[b][k / 64] |= uint64_t{1} << (k % 64);
      }
    }
    std::vector<Signature> seen;
    for (size_t b = 0; b < 128; ++b) {
      if (std::all_of(sig[b].begin(), sig[b].end(), [](uint64_t w) { return w == 0; })) continue;
      auto it = std::find(seen.begin(), seen.end(), sig[b]);
      if (it == seen.end()) {
        seen.push_back(sig[b]);
        c.masks.push_back({0, 0});
        it = seen.end() - 1;
      }
      const auto id = static_cast<int16_t>(1 + (it - seen.begin()));
      c.cls[b] = id;
      c.masks[static_cast<size_t>(id)][b / 64] |= uint64_t{1} << (b % 64);
    }
  }

  struct Run {
    std::vector<std::array<uint64_t, 2>> masks;  // masks[i]: alike at every step up to i
    int32_t last = -1;                           // the state after masks.size() steps
    bool ended = false;
  };
  struct WideRun {
    std::vector<int32_t> states;                 // states[i]: after i + 1 code points
    std::vector<std::array<uint64_t, 2>> level;  // level[i]: the ASCII bytes of code point i + 1
    std::vector<std::array<uint64_t, 2>> masks;  // masks[i]: level[0] & ... & level[i]
    // wide[i]: every non-ASCII code point leads along at level i + 1 (else none is taken there);
    // wide_all[i]: at every level up to it.
    std::vector<uint8_t> wide, wide_all;
    bool loops = false;  // the last level leads back to its own state: every later level is alike
    bool ended = false;
    // Where it ended: the ASCII bytes its last state takes in no parse, and whether it takes no
    // non-ASCII code point either.
    std::array<uint64_t, 2> end_refused{};
    bool end_wide_dead = false;
  };

  // The ASCII bytes no stack of boundary state h takes.
  std::array<uint64_t, 2> refused_by(int32_t h) {
    if (classes_.size() <= static_cast<size_t>(h)) classes_.resize(states_.size());
    if (classes_[static_cast<size_t>(h)].masks.empty()) fill_classes(states_[static_cast<size_t>(h)], classes_[static_cast<size_t>(h)]);
    std::array<uint64_t, 2> taken{};
    for (const std::array<uint64_t, 2>& m : classes_[static_cast<size_t>(h)].masks) {
      taken[0] |= m[0];
      taken[1] |= m[1];
    }
    return {~taken[0], ~taken[1]};
  }
  static constexpr int32_t kNoHome = -2;
  std::vector<int32_t> home_;       // by state: find_home(), or kNoHome before it is known
  std::vector<WideRun> wide_runs_;  // by boundary state

  const Automaton& automaton_;
  bool split_;
  std::vector<Classes> classes_;  // by state, filled on demand
  std::vector<Run> runs_;
  std::vector<int32_t> run_of_;  // by state * 256 + byte: its run in runs_, or -1
  std::vector<MatchState> states_;  // each state as first met (advanced from)
  std::vector<MatchState> keys_;    // and as compared (intern())
  std::unordered_multimap<size_t, int32_t> index_;
  static constexpr int32_t kUnknown = -1;
  std::vector<int32_t> steps_;  // (next + 1) * 2 + finished, or kUnknown
  size_t work_ = 0;
};

}  // namespace specula::grammar
