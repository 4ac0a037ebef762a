// TokenMasker.
#include "specula/grammar/token_masker.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <string>

#include "specula/core/error.h"
#include "specula/grammar/sentence.h"

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

size_t TokenMasker::KeyHash::operator()(const std::vector<Position>& k) const {
  size_t h = k.size();
  for (const Position& p : k) {
    h = h * 1000003u ^ static_cast<size_t>(p.rule);
    h = h * 1000003u ^ static_cast<size_t>(p.alt);
    h = h * 1000003u ^ static_cast<size_t>(p.index);
  }
  return h;
}

size_t TokenMasker::cached_tops() const {
  std::shared_lock<std::shared_mutex> hold(mutex_);
  return cache_.size();
}

std::vector<double> TokenMasker::classify_seconds() const {
  std::shared_lock<std::shared_mutex> hold(mutex_);
  return classify_seconds_;
}

const TokenMasker::Entry& TokenMasker::entry(std::span<const Position> frames, bool below) {
  // The key: the frames, and whether anything lies below them (a trailing mark).
  std::vector<Position> key(frames.begin(), frames.end());
  if (below) key.push_back(Position{-1, 0, 0});
  {
    std::shared_lock<std::shared_mutex> hold(mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  const auto start = std::chrono::steady_clock::now();
  MatchState single;
  single.stacks = {Stack(frames.begin(), frames.end())};
  Entry e;
  std::vector<std::pair<int32_t, int32_t>> uncertain;
  vocabulary_->trie.classify(*automaton_, single, e.accepted, uncertain, below);
  std::sort(uncertain.begin(), uncertain.end());
  uncertain.erase(std::unique(uncertain.begin(), uncertain.end()), uncertain.end());
  e.uncertain = uncertain.size();
  // A key whose frames leave many tokens to the frames below is not worth a rest trie when a
  // deeper key can be used instead (fill() goes deeper for it).
  const bool deeper = frames.size() == kKeyFrames && uncertain.size() > kMaxUncertain;
  if (!uncertain.empty() && !deeper) {
    std::vector<std::string> rests;
    for (const auto& [id, at] : uncertain) {
      rests.push_back(vocabulary_->tokens[static_cast<size_t>(id)].substr(static_cast<size_t>(at)));
      e.rest_token.push_back(id);
    }
    e.rests = std::make_unique<TokenTrie>(rests);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::unique_lock<std::shared_mutex> hold(mutex_);
  const auto [it, inserted] = cache_.emplace(std::move(key), std::move(e));
  if (inserted) classify_seconds_.push_back(seconds);
  return it->second;
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
  std::vector<uint32_t> rest_mask;
  for (const Stack& s : state.stacks) {
    if (s.empty()) continue;
    size_t k = std::min(kKeyFrames, s.size());
    // A top that left too many tokens to the frames below once goes deeper at once: the other
    // counts of the same repetition would too.
    bool deep = false;
    if (s.size() > k) {
      std::shared_lock<std::shared_mutex> hold(mutex_);
      deep = deep_tops_.contains(s.back());
    }
    const Entry* e = deep ? nullptr : &entry(std::span<const Position>(s).last(k), s.size() > k);
    if (deep || (e->uncertain > kMaxUncertain && s.size() > k)) {
      if (!deep) {
        std::unique_lock<std::shared_mutex> hold(mutex_);
        deep_tops_.insert(s.back());
      }
      k = std::min(kDeepKeyFrames, s.size());
      e = &entry(std::span<const Position>(s).last(k), s.size() > k);
    }
    for (size_t w = 0; w < words; ++w) bitmask[w] |= e->accepted[w];
    // With nothing below the frames the parse is complete where they finish: no rest fits.
    if (e->rests == nullptr || s.size() == k) continue;
    const MatchState below = automaton_->resume(Stack(s.begin(), s.end() - static_cast<int64_t>(k)));
    e->rests->fill_mask(*automaton_, below, rest_mask);
    for (size_t r = 0; r < e->rest_token.size(); ++r) {
      if ((rest_mask[r / 32] >> (r % 32)) & 1u) {
        const int32_t id = e->rest_token[r];
        bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
      }
    }
  }
}

int64_t TokenMasker::warm_up(double seconds, uint64_t seed, const std::atomic<bool>* stop) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  const auto done = [&] {
    return (stop != nullptr && stop->load(std::memory_order_relaxed)) || std::chrono::steady_clock::now() >= end;
  };
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<uint32_t> bitmask;
  int64_t masks = 0;
  // Converged: this many sentences in a row met no key that was not classified already.
  constexpr int kQuietSentences = 16;
  try {
    for (int quiet = 0; quiet < kQuietSentences && !done();) {
      const size_t tops_before = cached_tops();
      const std::string text = random_sentence(*automaton_, rng, 300);
      MatchState state = automaton_->start();
      for (size_t i = 0; i <= text.size() && !done(); ++i) {
        // Inside a code point the mask walks the whole trie uncached: nothing to warm there.
        if (state.partial_len == 0) {
          fill(state, bitmask);
          ++masks;
        }
        if (i == text.size()) break;
        state = automaton_->advance(state, static_cast<uint8_t>(text[i]));
        if (state.dead()) break;
      }
      quiet = cached_tops() == tops_before ? quiet + 1 : 0;
    }
  } catch (const Error&) {
    // A walk or mask past the grammar's limits (an ambiguous grammar): the requests that meet it
    // will say so; what was classified until then stays.
  }
  return masks;
}

}  // namespace specula::grammar
