// TokenMasker.
#include "specula/grammar/token_masker.h"

#include <algorithm>

#include "specula/core/error.h"

namespace specula::grammar {

TokenMasker::TokenMasker(std::shared_ptr<const Automaton> automaton, std::shared_ptr<const Vocabulary> vocabulary)
    : automaton_(std::move(automaton)), vocabulary_(std::move(vocabulary)) {
  SPECULA_CHECK(automaton_ != nullptr && vocabulary_ != nullptr, "a token masker needs an automaton and a vocabulary");
}

bool TokenMasker::accepts(const MatchState& state, std::string_view bytes) const {
  if (bytes.empty()) return false;
  MatchState s = state;
  for (char c : bytes) {
    s = automaton_->advance(s, static_cast<uint8_t>(c));
    if (s.dead()) return false;
  }
  return true;
}

const TokenMasker::Entry& TokenMasker::entry(const Position& top) {
  const uint64_t key = (static_cast<uint64_t>(top.rule) << 42) ^ (static_cast<uint64_t>(top.alt) << 21) ^
                       static_cast<uint64_t>(top.index);
  const auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  MatchState single;
  single.stacks = {Stack{top}};
  Entry e;
  vocabulary_->trie.classify(*automaton_, single, e.accepted, e.uncertain);
  std::sort(e.uncertain.begin(), e.uncertain.end());
  e.uncertain.erase(std::unique(e.uncertain.begin(), e.uncertain.end()), e.uncertain.end());
  return cache_.emplace(key, std::move(e)).first->second;
}

void TokenMasker::fill(const MatchState& state, std::vector<uint32_t>& bitmask) {
  const size_t words = (static_cast<size_t>(vocabulary_->size()) + 31) / 32;
  if (state.dead()) {
    bitmask.assign(words, 0u);
    return;
  }
  // Half a code point read: the tops wait for its last bytes, which the cache does not model.
  if (state.partial_len > 0) {
    vocabulary_->trie.fill_mask(*automaton_, state, bitmask);
    return;
  }
  bitmask.assign(words, 0u);
  size_t work = 0;
  MatchState one;
  for (const Stack& s : state.stacks) {
    if (s.empty()) continue;
    const Entry& e = entry(s.back());
    for (size_t w = 0; w < words; ++w) bitmask[w] |= e.accepted[w];
    if (e.uncertain.empty()) continue;
    one.stacks.assign(1, s);
    for (int32_t id : e.uncertain) {
      if ((bitmask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) continue;
      const std::string& bytes = vocabulary_->tokens[static_cast<size_t>(id)];
      work += bytes.size() * (s.size() + 1);
      SPECULA_CHECK(work <= TokenTrie::kMaxMaskWork,
                    "grammar: the next-token mask needs more than {} parse steps (the limit); the grammar is too ambiguous",
                    TokenTrie::kMaxMaskWork);
      if (accepts(one, bytes)) bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    }
  }
}

}  // namespace specula::grammar
