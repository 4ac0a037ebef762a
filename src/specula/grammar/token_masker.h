// Next-token masks with xgrammar's adaptive cache (issue 51): for the top kKeyFrames frames of
// each stack the grammar reaches, the vocabulary is split once into the tokens those frames take
// in any context (a bitmask ORed in) and the few that finish them and go on (JSON: a string's
// closing quote and what follows it in the token); the rest of each such token, after the point
// where the frames finished, goes into a small trie walked at run time from the state of the
// frames below. Every other token is refused whatever lies below. A mask then costs a bitmask OR
// and a short walk instead of a walk of the whole vocabulary trie. Entries are computed on first
// use and kept with the masker, so requests that share a grammar share them (and the frames of,
// say, every plain JSON string of a schema share one entry).
//
// Thread-safe: the scheduler fills the rows of one step on several threads, and rows of one
// grammar share its masker. Lookups take a shared lock; a missing entry is classified outside any
// lock and inserted under an exclusive one (a thread that lost the race drops its copy). Entries
// are never removed, and std::unordered_map keeps references to them valid.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "specula/grammar/matcher.h"
#include "specula/grammar/token_constraint.h"

namespace specula::grammar {

class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const Automaton> automaton, std::shared_ptr<const Vocabulary> vocabulary);

  const std::shared_ptr<const Automaton>& automaton() const { return automaton_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }

  // The tokens the grammar accepts after `state` (end tokens aside), in TokenTrie's bitmask layout.
  void fill(const MatchState& state, std::vector<uint32_t>& bitmask);
  // Whether `bytes` are accepted after `state`.
  bool accepts(const MatchState& state, std::string_view bytes) const;
  // xgrammar classifies a grammar's keys when it compiles it; here they are classified on first
  // use, so a new grammar's first steps wait for them. warm_up classifies ahead: it walks random
  // sentences of the grammar (sentence.h) and fills the mask after every byte, until 16 sentences
  // in a row meet no new key, `seconds` have passed or *stop is set; returns the masks filled.
  // Any thread (the masker is thread-safe).
  int64_t warm_up(double seconds, uint64_t seed, const std::atomic<bool>* stop = nullptr);
  // Frame sequences classified so far, and the time each classification took (seconds).
  size_t cached_tops() const;
  std::vector<double> classify_seconds() const;

  // How many top frames key an entry: enough to hold a JSON string's own frame (its closing
  // quote), its repetition's and the character's, so that the frames finish at the closing quote
  // and not after every character (with 3, a string bounded by maxLength made nearly every token
  // "uncertain": bench grammar's p99 went from 32 ms to 5.6 ms with 4, and 5 or 6 gave no more).
  static constexpr size_t kKeyFrames = 4;
  // A key of kKeyFrames frames that leaves more than kMaxUncertain (token, offset) pairs to the
  // frames below (nested bounded repetitions, such as a pattern's `([a-z]{1,10}/?){0,5}` inside a
  // string, fill the key before it reaches the string's closing quote) is replaced by one of
  // kDeepKeyFrames for the stacks that have them: a rest trie of thousands of tokens cost 5-7 ms
  // to build and a walk per mask, the deeper key's classification about 1 ms.
  static constexpr size_t kDeepKeyFrames = 8;
  static constexpr size_t kMaxUncertain = 1024;

 private:
  struct Entry {
    size_t uncertain = 0;               // (token, offset) pairs the frames below decide
    std::vector<uint32_t> accepted;     // bitmask over the vocabulary
    std::unique_ptr<TokenTrie> rests;   // what uncertain tokens leave for the frames below
    std::vector<int32_t> rest_token;    // rests' id -> vocabulary id
  };
  struct KeyHash {
    size_t operator()(const std::vector<Position>& k) const;
  };
  // The entry of the top `frames` of a stack; below: whether the stack has more frames.
  const Entry& entry(std::span<const Position> frames, bool below);

  std::shared_ptr<const Automaton> automaton_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  mutable std::shared_mutex mutex_;  // guards the three members below
  std::unordered_map<std::vector<Position>, Entry, KeyHash> cache_;
  std::set<Position> deep_tops_;  // stack tops whose kKeyFrames keys were too uncertain
  std::vector<double> classify_seconds_;
};

}  // namespace specula::grammar
