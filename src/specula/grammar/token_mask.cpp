// TokenTrie.
#include "specula/grammar/token_mask.h"

#include <algorithm>
#include <unordered_map>

#include "specula/core/error.h"

namespace specula::grammar {

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
    const size_t h = hash(s);
    for (auto [it, end] = index_.equal_range(h); it != end; ++it) {
      if (states_[static_cast<size_t>(it->second)] == s) return it->second;
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
    index_.emplace(h, id);
    steps_.resize(steps_.size() + 256, kUnknown);
    return id;
  }

  Step step(int32_t from, uint8_t byte) {
    const size_t slot = static_cast<size_t>(from) * 256 + byte;
    if (steps_[slot] != kUnknown) return {steps_[slot] / 2 - 1, (steps_[slot] & 1) != 0};
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

 private:
  static size_t hash(const MatchState& s) {
    size_t h = s.partial_len * 31u + s.partial_need;
    for (int i = 0; i < s.partial_len; ++i) h = h * 131u + s.partial[i];
    for (const Stack& st : s.stacks) {
      h = h * 1000003u + st.size();
      for (const Position& p : st) h = (h * 1000003u) ^ static_cast<size_t>(p.rule * 65599 + p.alt * 257 + p.index);
    }
    return h;
  }

  const Automaton& automaton_;
  bool split_;
  std::vector<MatchState> states_;
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

void TokenTrie::classify_walk(Transitions& t, int32_t node, int32_t depth, int32_t state, std::vector<int32_t>& open,
                              std::vector<uint32_t>& accepted, std::vector<std::pair<int32_t, int32_t>>& uncertain) const {
  const auto n = static_cast<size_t>(node);
  for (uint32_t e = edges_[n]; e < edges_[n + 1]; ++e) {
    // finished: every frame finished with this byte. A token that ends here is taken in any
    // context (what lies below always goes on); one that goes on may continue below.
    const Transitions::Step step = t.step(state, edge_byte_[e]);
    const bool live = step.next >= 0 || step.finished;
    const auto kid = static_cast<size_t>(edge_child_[e]);
    for (uint32_t k = tokens_[kid]; k < tokens_[kid + 1]; ++k) {
      const int32_t id = token_ids_[k];
      if (live) {
        accepted[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
      } else {
        for (int32_t at : open) uncertain.emplace_back(id, at);
      }
    }
    if (step.finished) open.push_back(depth + 1);
    if (step.next >= 0) {
      classify_walk(t, static_cast<int32_t>(kid), depth + 1, step.next, open, accepted, uncertain);
    } else if (!open.empty()) {
      for (uint32_t g = edges_[kid]; g < edges_[kid + 1]; ++g) collect(edge_child_[g], open, uncertain);
    }
    if (step.finished) open.pop_back();
  }
}

void TokenTrie::classify(const Automaton& automaton, const MatchState& single, std::vector<uint32_t>& accepted,
                         std::vector<std::pair<int32_t, int32_t>>& uncertain) const {
  accepted.assign((static_cast<size_t>(vocab_size_) + 31) / 32, 0u);
  uncertain.clear();
  Transitions t(automaton, /*split=*/true);
  const int32_t start = t.intern(single);
  std::vector<int32_t> open;
  if (start >= 0) classify_walk(t, 0, 0, start, open, accepted, uncertain);
}

}  // namespace specula::grammar
