// TokenTrie::classify: xgrammar's split of the vocabulary for the top frames of a stack (see
// token_mask.h), by a walk of the trie that follows chains of code points with bit tests and
// takes whole subtrees, or a class's tokens by their lengths, where the chain decides them.
#include <algorithm>
#include <array>
#include <vector>

#include "specula/core/error.h"
#include "specula/grammar/token_mask.h"
#include "specula/grammar/token_walk.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

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
  // utf8_ok_ and the class bitmasks read UTF-8 from the trie's root: the walk must start at a
  // code-point boundary (TokenMasker::fill sends states inside one to fill_mask).
  SPECULA_ASSERT(single.partial_len == 0, "classify from inside a code point");
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

}  // namespace specula::grammar
