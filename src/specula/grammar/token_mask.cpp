// TokenTrie: the trie, its per-node summaries, the plain mask walk and the class bitmasks.
#include "specula/grammar/token_mask.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>

#include "specula/core/error.h"
#include "specula/grammar/token_walk.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

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

struct TokenTrie::ClassBitsCache {
  std::mutex mutex;
  std::map<std::pair<std::array<uint64_t, 2>, bool>, std::vector<std::vector<uint32_t>>> bits;
};

TokenTrie::~TokenTrie() = default;
TokenTrie::TokenTrie(TokenTrie&&) noexcept = default;
TokenTrie& TokenTrie::operator=(TokenTrie&&) noexcept = default;

const std::vector<std::vector<uint32_t>>& TokenTrie::class_bits(const std::array<uint64_t, 2>& ascii, bool wide) const {
  std::lock_guard<std::mutex> lock(class_bits_->mutex);
  const auto key = std::make_pair(ascii, wide);
  if (const auto it = class_bits_->bits.find(key); it != class_bits_->bits.end()) return it->second;
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
  // Built aside and cached only when whole: a failure (out of memory) leaves no partial table.
  std::vector<std::vector<uint32_t>> out;
  std::vector<uint32_t> acc((static_cast<size_t>(vocab_size_) + 31) / 32, 0u);
  // Up to the longest such token (the table is short for a narrow class).
  size_t longest = 0;
  for (size_t len = 1; len < by_cp.size(); ++len) longest = by_cp[len].empty() ? longest : len;
  for (int len = 1; len <= static_cast<int>(longest); ++len) {
    for (int32_t id : by_cp[static_cast<size_t>(len)]) acc[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    out.push_back(acc);
  }
  return class_bits_->bits.emplace(key, std::move(out)).first->second;
}

}  // namespace specula::grammar
