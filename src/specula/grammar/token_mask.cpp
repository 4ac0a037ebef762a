// TokenTrie.
#include "specula/grammar/token_mask.h"

#include <algorithm>

#include "specula/core/error.h"

namespace specula::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& tokens) : vocab_size_(static_cast<int>(tokens.size())) {
  nodes_.emplace_back();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].empty()) continue;
    int32_t n = 0;
    for (char c : tokens[id]) {
      const auto b = static_cast<uint8_t>(c);
      auto& kids = nodes_[static_cast<size_t>(n)].children;
      const auto it = std::lower_bound(kids.begin(), kids.end(), b, [](const auto& k, uint8_t v) { return k.first < v; });
      if (it != kids.end() && it->first == b) {
        n = it->second;
      } else {
        const auto child = static_cast<int32_t>(nodes_.size());
        kids.insert(it, {b, child});
        nodes_.emplace_back();
        n = child;
      }
    }
    nodes_[static_cast<size_t>(n)].tokens.push_back(static_cast<int32_t>(id));
  }
}

void TokenTrie::walk(const Automaton& automaton, int32_t node, const MatchState& state, std::vector<uint32_t>& bitmask,
                     size_t& work) const {
  const Node& nd = nodes_[static_cast<size_t>(node)];
  for (int32_t id : nd.tokens) bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  for (const auto& [byte, child] : nd.children) {
    work += state.stacks.size() + 1;
    SPECULA_CHECK(work <= kMaxMaskWork,
                  "grammar: the next-token mask needs more than {} parse steps (the limit); the grammar is too ambiguous",
                  kMaxMaskWork);
    const MatchState next = automaton.advance(state, byte);
    if (!next.dead()) walk(automaton, child, next, bitmask, work);
  }
}

void TokenTrie::fill_mask(const Automaton& automaton, const MatchState& state, std::vector<uint32_t>& bitmask) const {
  bitmask.assign((static_cast<size_t>(vocab_size_) + 31) / 32, 0u);
  if (state.dead()) return;
  // The root's own tokens are the empty ones, which are never accepted.
  size_t work = 0;
  for (const auto& [byte, child] : nodes_[0].children) {
    work += state.stacks.size() + 1;
    const MatchState next = automaton.advance(state, byte);
    if (!next.dead()) walk(automaton, child, next, bitmask, work);
  }
}

void TokenTrie::collect(int32_t node, std::vector<int32_t>& out) const {
  const Node& nd = nodes_[static_cast<size_t>(node)];
  out.insert(out.end(), nd.tokens.begin(), nd.tokens.end());
  for (const auto& kid : nd.children) collect(kid.second, out);
}

void TokenTrie::classify_walk(const Automaton& automaton, int32_t node, const MatchState& state, bool open,
                              std::vector<uint32_t>& accepted, std::vector<int32_t>& uncertain) const {
  const Node& nd = nodes_[static_cast<size_t>(node)];
  for (const auto& [byte, child] : nd.children) {
    MatchState next = automaton.advance(state, byte);
    // An empty stack: the bottom frame finished here. A token that ends here is taken in any
    // context; one that goes on may continue in what lies below.
    const bool live = !next.dead();
    const auto ended = std::remove_if(next.stacks.begin(), next.stacks.end(), [](const Stack& s) { return s.empty(); });
    const bool finished = ended != next.stacks.end();
    next.stacks.erase(ended, next.stacks.end());
    const Node& kid = nodes_[static_cast<size_t>(child)];
    for (int32_t id : kid.tokens) {
      if (live) accepted[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
      else if (open) uncertain.push_back(id);
    }
    const bool still_open = open || finished;
    if (!next.dead()) {
      classify_walk(automaton, child, next, still_open, accepted, uncertain);
    } else if (still_open) {
      // Only what lies below could take the rest.
      for (const auto& grandchild : kid.children) collect(grandchild.second, uncertain);
    }
  }
}

void TokenTrie::classify(const Automaton& automaton, const MatchState& single, std::vector<uint32_t>& accepted,
                         std::vector<int32_t>& uncertain) const {
  accepted.assign((static_cast<size_t>(vocab_size_) + 31) / 32, 0u);
  uncertain.clear();
  classify_walk(automaton, 0, single, false, accepted, uncertain);
}

}  // namespace specula::grammar
