// TokenTrie.
#include "specula/grammar/token_mask.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "specula/core/error.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

// The walks meet few distinct states (inside a JSON string every character leads back to the same
// one), so a walk interns its states and computes each (state, byte) transition once: a trie node
// then costs a table lookup rather than an automaton step.
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
      // wide_step() may intern states, which grows wide_runs_ no further: index again after it.
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

TokenTrie::TokenTrie(const std::vector<std::string>& tokens) : vocab_size_(static_cast<int>(tokens.size())) {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // by byte, sorted
    std::vector<int32_t> tokens;                         // ids whose bytes end here
  };
  std::vector<Node> nodes(1);
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].empty()) continue;
    int32_t n = 0;
    for (char c : tokens[id]) {
      const auto b = static_cast<uint8_t>(c);
      auto& kids = nodes[static_cast<size_t>(n)].children;
      const auto it = std::lower_bound(kids.begin(), kids.end(), b, [](const auto& k, uint8_t v) { return k.first < v; });
      if (it != kids.end() && it->first == b) {
        n = it->second;
      } else {
        const auto child = static_cast<int32_t>(nodes.size());
        kids.insert(it, {b, child});
        nodes.emplace_back();
        n = child;
      }
    }
    nodes[static_cast<size_t>(n)].tokens.push_back(static_cast<int32_t>(id));
  }
  // Depth-first numbering, then the flat arrays.
  std::vector<int32_t> order, number(nodes.size());
  order.reserve(nodes.size());
  std::vector<int32_t> todo = {0};
  while (!todo.empty()) {
    const int32_t n = todo.back();
    todo.pop_back();
    number[static_cast<size_t>(n)] = static_cast<int32_t>(order.size());
    order.push_back(n);
    const auto& kids = nodes[static_cast<size_t>(n)].children;
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) todo.push_back(it->second);
  }
  edges_.assign(1, 0);
  tokens_.assign(1, 0);
  for (int32_t n : order) {
    const Node& nd = nodes[static_cast<size_t>(n)];
    for (const auto& [byte, child] : nd.children) {
      edge_byte_.push_back(byte);
      edge_child_.push_back(number[static_cast<size_t>(child)]);
    }
    token_ids_.insert(token_ids_.end(), nd.tokens.begin(), nd.tokens.end());
    edges_.push_back(static_cast<uint32_t>(edge_byte_.size()));
    tokens_.push_back(static_cast<uint32_t>(token_ids_.size()));
  }
  // Well-formed UTF-8 along every path: each node's decoding state from its parent's, forward
  // (parents come first in depth-first order), then summed up backwards with the rest.
  const size_t count = order.size();
  struct Utf8 {
    uint8_t bytes[4] = {};
    uint8_t len = 0, need = 0;
    bool ok = true;
  };
  std::vector<Utf8> utf8(count);
  for (size_t n = 0; n < count; ++n) {
    for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) {
      Utf8 u = utf8[n];
      const uint8_t b = edge_byte_[e];
      if (!u.ok) {
      } else if (u.len == 0) {
        const int need = utf8_length(b);
        u.ok = need > 0;
        if (need > 1) {
          u.bytes[0] = b;
          u.len = 1;
          u.need = static_cast<uint8_t>(need);
          u.ok = utf8_completable(utf8_completions(u.bytes, 1, need));
        }
      } else if ((b & 0xC0) != 0x80) {
        u.ok = false;
      } else {
        u.bytes[u.len++] = b;
        if (u.len == u.need) {
          uint32_t cp = 0;
          u.ok = decode_utf8(std::string_view(reinterpret_cast<const char*>(u.bytes), u.len), cp) == u.len;
          u.len = u.need = 0;
        } else {
          u.ok = utf8_completable(utf8_completions(u.bytes, u.len, u.need));
        }
      }
      utf8[static_cast<size_t>(edge_child_[e])] = u;
    }
  }
  utf8_below_.assign(count, 1);
  utf8_ok_.resize(count);
  for (size_t n = 0; n < count; ++n) utf8_ok_[n] = utf8[n].ok ? 1 : 0;
  // Code points begun along each path (a continuation byte begins none), and each token's.
  cp_depth_.assign(count, 0);
  for (size_t n = 0; n < count; ++n) {
    for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) {
      const bool begins = (edge_byte_[e] & 0xC0) != 0x80;
      cp_depth_[static_cast<size_t>(edge_child_[e])] = static_cast<uint16_t>(cp_depth_[n] + (begins ? 1 : 0));
    }
  }
  token_cp_.resize(token_ids_.size());
  for (size_t n = 0; n < count; ++n) {
    for (uint32_t k = tokens_[n]; k < tokens_[n + 1]; ++k) {
      token_cp_[k] = cp_depth_[n];
      max_cp_ = std::max<int>(max_cp_, cp_depth_[n]);
    }
  }
  class_bits_ = std::make_unique<ClassBitsCache>();
  // Children follow their parent in depth-first order: one backward pass sums the subtrees up.
  subtree_end_.assign(count, 0);
  below_.assign(count, {0, 0});
  below_wide_.assign(count, 0);
  height_.assign(count, 0);
  for (size_t n = count; n-- > 0;) {
    subtree_end_[n] = static_cast<uint32_t>(n + 1);
    for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) {
      const auto kid = static_cast<size_t>(edge_child_[e]);
      const uint8_t b = edge_byte_[e];
      subtree_end_[n] = std::max(subtree_end_[n], subtree_end_[kid]);
      below_[n][0] |= below_[kid][0];
      below_[n][1] |= below_[kid][1];
      below_wide_[n] |= below_wide_[kid];
      utf8_below_[n] &= static_cast<uint8_t>(utf8_below_[kid] & (utf8[kid].ok ? 1 : 0));
      if (b < 128) {
        below_[n][b / 64] |= uint64_t{1} << (b % 64);
      } else {
        below_wide_[n] = 1;
      }
      height_[n] = static_cast<uint8_t>(std::max<int>(height_[n], std::min(255, height_[kid] + 1)));
    }
  }
}

bool TokenTrie::uniform_below(Transitions& t, int32_t node, int32_t state) const {
  const auto n = static_cast<size_t>(node);
  if (below_wide_[n] != 0 || height_[n] == 0 || height_[n] == 255) return false;
  const std::array<uint64_t, 2>& bytes = below_[n];
  const auto rep = static_cast<uint8_t>(bytes[0] != 0 ? __builtin_ctzll(bytes[0]) : 64 + __builtin_ctzll(bytes[1]));
  // Every string over these bytes, up to the subtree's height, follows the path of `rep`'s
  // repetitions: the path must stay alive and inside the frames all the way.
  const std::array<uint64_t, 2> same = t.alike_run(state, rep, height_[n]);
  return (bytes[0] & ~same[0]) == 0 && (bytes[1] & ~same[1]) == 0;
}

bool TokenTrie::wide_below(Transitions& t, int32_t node, int32_t state) const {
  const auto n = static_cast<size_t>(node);
  if (below_wide_[n] == 0 || utf8_below_[n] == 0 || height_[n] == 255) return false;
  // Code points below number at most the subtree's height in bytes.
  const std::array<uint64_t, 2> same = t.wide_run(state, height_[n]);
  const std::array<uint64_t, 2>& bytes = below_[n];
  return (same[0] | same[1]) != 0 && (bytes[0] & ~same[0]) == 0 && (bytes[1] & ~same[1]) == 0;
}

void TokenTrie::walk(Transitions& t, int32_t node, int32_t state, std::vector<uint32_t>& bitmask) const {
  const auto n = static_cast<size_t>(node);
  for (uint32_t k = tokens_[n]; k < tokens_[n + 1]; ++k) {
    const int32_t id = token_ids_[k];
    bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
  for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) {
    const int32_t next = t.step(state, edge_byte_[e]).next;
    if (next >= 0) walk(t, edge_child_[e], next, bitmask);
  }
}

void TokenTrie::fill_mask(const Automaton& automaton, const MatchState& state, std::vector<uint32_t>& bitmask) const {
  bitmask.assign((static_cast<size_t>(vocab_size_) + 31) / 32, 0u);
  Transitions t(automaton, /*split=*/false);
  const int32_t start = t.intern(state);
  // The root's own tokens are the empty ones, which are never accepted.
  if (start >= 0) walk(t, 0, start, bitmask);
}

void TokenTrie::collect(int32_t node, const std::vector<int32_t>& open,
                        std::vector<std::pair<int32_t, int32_t>>& out) const {
  const auto n = static_cast<size_t>(node);
  for (uint32_t k = tokens_[n]; k < tokens_[n + 1]; ++k) {
    for (int32_t at : open) out.emplace_back(token_ids_[k], at);
  }
  for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) collect(edge_child_[e], open, out);
}

struct TokenTrie::Classification {
  Transitions& t;
  bool below;
  std::vector<uint32_t>& accepted;
  std::vector<std::pair<int32_t, int32_t>>& uncertain;
  std::vector<int32_t> open;  // byte offsets where the frames finished on the current path
  // Set when a class bitmask (class_bits) decided every token made of `pure` ASCII bytes and
  // well-formed non-ASCII ones from the root: the walk skips their subtrees.
  bool covered = false;
  std::array<uint64_t, 2> pure{};
  bool pure_wide = false;  // non-ASCII code points are of the class too

  void accept(int32_t id) {
    const auto u = static_cast<uint32_t>(id);
    accepted[u / 32] |= 1u << (u % 32);
  }
  // Every id of ids[0, n); and those whose code points number at most `most` (branch-free: the
  // two kinds interleave in the trie's order).
  void accept_all(const int32_t* ids, size_t n) {
    uint32_t* bits = accepted.data();
    for (size_t i = 0; i < n; ++i) {
      const auto u = static_cast<uint32_t>(ids[i]);
      bits[u / 32] |= 1u << (u % 32);
    }
  }
  void accept_short(const int32_t* ids, const uint16_t* cps, size_t n, int most) {
    uint32_t* bits = accepted.data();
    for (size_t i = 0; i < n; ++i) {
      const auto u = static_cast<uint32_t>(ids[i]);
      bits[u / 32] |= static_cast<uint32_t>(cps[i] <= most) << (u % 32);
    }
  }
};

void TokenTrie::classify_walk(Classification& c, int32_t node, int32_t depth, int32_t state) const {
  const auto n = static_cast<size_t>(node);
  for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) classify_edge(c, e, depth, state);
}

void TokenTrie::classify_edge(Classification& c, uint32_t e, int32_t depth, int32_t state) const {
  // finished: every frame finished with this byte. A token that ends here is taken in any
  // context (what lies below always goes on); one that goes on may continue below.
  const Transitions::Step step = c.t.step(state, edge_byte_[e]);
  const bool live = step.next >= 0 || step.finished;
  const auto kid = static_cast<size_t>(edge_child_[e]);
  for (uint32_t k = tokens_[kid]; k < tokens_[kid + 1]; ++k) {
    const int32_t id = token_ids_[k];
    if (live) {
      c.accept(id);
    } else {
      for (int32_t at : c.open) c.uncertain.emplace_back(id, at);
    }
  }
  const bool opens = step.finished && c.below;
  if (opens) c.open.push_back(depth + 1);
  const auto k32 = static_cast<int32_t>(kid);
  if (step.next >= 0 && (uniform_below(c.t, k32, step.next) || wide_below(c.t, k32, step.next))) {
    c.accept_all(token_ids_.data() + tokens_[kid + 1], tokens_[subtree_end_[kid]] - tokens_[kid + 1]);
  } else if (step.next >= 0) {
    // A chain needs no open offsets: its dead ends are then refused, not uncertain.
    const int32_t home = c.open.empty() ? c.t.chain_home(step.next) : -1;
    if (home >= 0 && c.t.wide_first(home)) {
      chain_walk(c, c.t.chain(home), k32, depth + 1, 0, c.t.pending(step.next), false);
    } else {
      classify_walk(c, k32, depth + 1, step.next);
    }
  } else if (!c.open.empty()) {
    for (uint32_t g = edges_[kid]; g < edges_[kid + 1]; ++g) collect(edge_child_[g], c.open, c.uncertain);
  }
  if (opens) c.open.pop_back();
}

void TokenTrie::chain_walk(Classification& c, const Chain& chain, int32_t node, int32_t depth, int level, int pending,
                           bool pure) const {
  const auto n = static_cast<size_t>(node);
  for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) {
    const uint8_t b = edge_byte_[e];
    const auto kid = static_cast<size_t>(edge_child_[e]);
    // Not UTF-8 along the path: no parse takes it.
    if (utf8_ok_[kid] == 0) continue;
    const bool pure_kid = pure && (b >= 0x80 ? c.pure_wide : ((c.pure[b / 64] >> (b % 64)) & 1u) != 0);
    if (c.covered && pure_kid && utf8_below_[kid] != 0 && (below_[kid][0] & ~c.pure[0]) == 0 &&
        (below_[kid][1] & ~c.pure[1]) == 0 && (c.pure_wide || below_wide_[kid] == 0)) {
      continue;
    }
    int lvl = level, pend = pending - 1;
    if (pending == 0) {
      // A code point starts: the chain must reach its level, and an ASCII byte must be one of it.
      lvl = level + 1;
      pend = utf8_length(b) - 1;
      if (lvl > chain.levels() || (b < 0x80 && ((chain.level(lvl)[b / 64] >> (b % 64)) & 1u) == 0) ||
          (b >= 0x80 && !chain.wide(lvl))) {
        classify_edge(c, e, depth, chain.state(level));
        continue;
      }
    }
    // Alive (a code point half read is one the chain's state takes), no frame finished.
    for (uint32_t k = tokens_[kid]; k < tokens_[kid + 1]; ++k) c.accept(token_ids_[k]);
    if (edges_[kid] == edges_[kid + 1]) continue;
    // A subtree that stays inside the chain is taken whole: its code points number at most its
    // height, and bytes the chain takes at every level up to there are taken at each.
    const int end = lvl + height_[kid];
    const std::array<uint64_t, 2>& bytes = below_[kid];
    const auto within = [&](const std::array<uint64_t, 2>& m) { return (bytes[0] & ~m[0]) == 0 && (bytes[1] & ~m[1]) == 0; };
    if (utf8_below_[kid] != 0 && height_[kid] != 255 && end <= chain.levels() && within(chain.mask(end)) &&
        (below_wide_[kid] == 0 || chain.wide_all(end))) {
      c.accept_all(token_ids_.data() + tokens_[kid + 1], tokens_[subtree_end_[kid]] - tokens_[kid + 1]);
    } else if (utf8_below_[kid] != 0 && chain.ended && chain.count > lvl && within(chain.mask(chain.count)) &&
               within(chain.end_refused) && (below_wide_[kid] == 0 || (chain.end_wide_dead && chain.wide_all(chain.count)))) {
      // Taller than the chain, which ends where every byte below dies: the tokens that end within
      // it are taken, the longer ones refused. No walk needed either.
      const int most = chain.count - lvl + cp_depth_[kid];
      c.accept_short(token_ids_.data() + tokens_[kid + 1], token_cp_.data() + tokens_[kid + 1],
                     tokens_[subtree_end_[kid]] - tokens_[kid + 1], most);
    } else {
      chain_walk(c, chain, static_cast<int32_t>(kid), depth + 1, lvl, pend, pure_kid);
    }
  }
}

void TokenTrie::classify(const Automaton& automaton, const MatchState& single, std::vector<uint32_t>& accepted,
                         std::vector<std::pair<int32_t, int32_t>>& uncertain, bool below) const {
  accepted.assign((static_cast<size_t>(vocab_size_) + 31) / 32, 0u);
  uncertain.clear();
  Transitions t(automaton, /*split=*/true);
  const int32_t start = t.intern(single);
  Classification c{t, below, accepted, uncertain, {}};
  if (start < 0) return;
  // A chain from the start (a string's body): the tokens made of its class are decided by their
  // lengths alone when the chain outlasts every token, or ends where its class dies.
  if (t.chain_home(start) == start && t.chain_extend(start, 1) >= 1) {
    const Chain chain = t.chain(start);
    const std::array<uint64_t, 2> pure = chain.mask(chain.count);
    const bool wide = chain.wide_all(chain.count);
    const bool ends_cleanly = chain.ended && (pure[0] & ~chain.end_refused[0]) == 0 &&
                              (pure[1] & ~chain.end_refused[1]) == 0 && (!wide || chain.end_wide_dead);
    if ((ends_cleanly || (!chain.ended && chain.levels() >= max_cp_)) && max_cp_ > 0) {
      const std::vector<std::vector<uint32_t>>& table = class_bits(pure, wide);
      if (!table.empty()) {
        const std::vector<uint32_t>& bits = table[static_cast<size_t>(std::min<int>(chain.levels(), static_cast<int>(table.size())) - 1)];
        for (size_t w = 0; w < bits.size(); ++w) accepted[w] |= bits[w];
      }
      c.covered = true;
      c.pure = pure;
      c.pure_wide = wide;
      chain_walk(c, chain, 0, 0, 0, 0, true);
      return;
    }
  }
  classify_walk(c, 0, 0, start);
}

struct TokenTrie::ClassBitsCache {
  std::mutex mutex;
  std::map<std::pair<std::array<uint64_t, 2>, bool>, std::vector<std::vector<uint32_t>>> bits;
};

TokenTrie::~TokenTrie() = default;
TokenTrie::TokenTrie(TokenTrie&&) noexcept = default;
TokenTrie& TokenTrie::operator=(TokenTrie&&) noexcept = default;

const std::vector<std::vector<uint32_t>>& TokenTrie::class_bits(const std::array<uint64_t, 2>& ascii, bool wide) const {
  std::lock_guard<std::mutex> lock(class_bits_->mutex);
  auto [it, fresh] = class_bits_->bits.try_emplace(std::make_pair(ascii, wide));
  if (!fresh) return it->second;
  // Nodes in depth-first order, so a parent's purity is known before its children's.
  const size_t count = edges_.size() - 1;
  std::vector<uint8_t> pure(count, 0);
  pure[0] = 1;
  std::vector<std::vector<int32_t>> by_cp(static_cast<size_t>(max_cp_) + 1);
  for (size_t n = 0; n < count; ++n) {
    if (pure[n] == 0) continue;
    if (n > 0) {
      for (uint32_t k = tokens_[n]; k < tokens_[n + 1]; ++k) by_cp[cp_depth_[n]].push_back(token_ids_[k]);
    }
    for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) {
      const uint8_t b = edge_byte_[e];
      const auto kid = static_cast<size_t>(edge_child_[e]);
      pure[kid] = utf8_ok_[kid] != 0 && (b >= 0x80 ? wide : ((ascii[b / 64] >> (b % 64)) & 1u) != 0) ? 1 : 0;
    }
  }
  std::vector<std::vector<uint32_t>>& out = it->second;
  std::vector<uint32_t> acc((static_cast<size_t>(vocab_size_) + 31) / 32, 0u);
  // Up to the longest such token (the table is short for a narrow class).
  size_t longest = 0;
  for (size_t len = 1; len < by_cp.size(); ++len) longest = by_cp[len].empty() ? longest : len;
  for (int len = 1; len <= static_cast<int>(longest); ++len) {
    for (int32_t id : by_cp[static_cast<size_t>(len)]) acc[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    out.push_back(acc);
  }
  return out;
}

}  // namespace specula::grammar
