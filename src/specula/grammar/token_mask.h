// Token masks (issue 51): which vocabulary tokens the grammar accepts next. The vocabulary's byte
// strings go into a trie once; a mask walks it depth-first from the matcher's state, feeding one
// byte per edge and dropping a whole subtree as soon as no parse survives its prefix, so tokens
// that share a rejected prefix cost one step together.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "specula/grammar/matcher.h"

namespace specula::grammar {

class TokenTrie {
 public:
  // tokens[id]: the token's bytes; empty strings (special tokens) are never accepted.
  explicit TokenTrie(const std::vector<std::string>& tokens);
  ~TokenTrie();
  TokenTrie(TokenTrie&&) noexcept;
  TokenTrie& operator=(TokenTrie&&) noexcept;
  int vocab_size() const { return vocab_size_; }

  // bitmask: ceil(vocab / 32) words, bit id % 32 of word id / 32 set for each token the grammar
  // accepts after `state` (xgrammar's and SGLang's layout). Throws specula::Error when the walk
  // meets parses of more than kMaxMaskWork stacks in all (an ambiguous grammar over a large
  // vocabulary), so that one request cannot stall the engine.
  void fill_mask(const Automaton& automaton, const MatchState& state, std::vector<uint32_t>& bitmask) const;

  static constexpr size_t kMaxMaskWork = size_t{1} << 23;

  // xgrammar's split of the vocabulary for the top frames of a stack, walked from `single` (a
  // state of those frames alone, nothing below them): `accepted` (a bitmask as above) holds the
  // tokens taken without going below the frames, which no context can change; `uncertain` the
  // tokens whose walk finishes every frame and goes on, each with the byte offset where that
  // happened (a token may have several): the rest must then be taken by what lies below. Every
  // other token is refused whatever lies below. Without below (the frames are a whole stack, so
  // that nothing can follow where they finish) no token is uncertain: those are refused.
  void classify(const Automaton& automaton, const MatchState& single, std::vector<uint32_t>& accepted,
                std::vector<std::pair<int32_t, int32_t>>& uncertain, bool below = true) const;

 private:
  // Flat, in depth-first order (a walk reads memory mostly forward): node n's edges are
  // edge_byte_ / edge_child_ [edges_[n], edges_[n + 1]), its tokens token_ids_ [tokens_[n],
  // tokens_[n + 1]).
  std::vector<uint32_t> edges_, tokens_;
  std::vector<uint8_t> edge_byte_;
  std::vector<int32_t> edge_child_, token_ids_;
  int vocab_size_ = 0;
  // Per node, what its subtree holds below it: the node one past the subtree (nodes [n, end) in
  // depth-first order, so its tokens are contiguous too), the ASCII bytes on its edges (a bitset;
  // below_wide_ when any byte is not ASCII) and its height in bytes (capped at 255). A walk skips
  // a subtree whose bytes all lead where the first of them leads, level after level (the body of a
  // string, a run of a character class): every token in it is taken alike.
  std::vector<uint32_t> subtree_end_;
  std::vector<std::array<uint64_t, 2>> below_;
  std::vector<uint8_t> below_wide_, height_;
  // Per node: whether every path from the root through it and on into its subtree is well-formed
  // UTF-8 (a code point may be unfinished at the end). Where every non-ASCII code point leads to
  // one state, level after level, and the subtree's ASCII bytes lead there too, such a subtree is
  // taken whole, non-ASCII tokens included (a JSON string's body, bounded or not).
  std::vector<uint8_t> utf8_below_;
  std::vector<uint8_t> utf8_ok_;  // per node: the path from the root to it is well-formed UTF-8
  // Per node, the code points begun along its path; per entry of token_ids_, its node's.
  std::vector<uint16_t> cp_depth_, token_cp_;

  class Transitions;
  // Whether every token below `node` is taken from `state` without finishing its frames (see
  // below_); then they need no walk.
  bool uniform_below(Transitions& t, int32_t node, int32_t state) const;
  // The same for a subtree with non-ASCII bytes (utf8_below_).
  bool wide_below(Transitions& t, int32_t node, int32_t state) const;
  void walk(Transitions& t, int32_t node, int32_t state, std::vector<uint32_t>& bitmask) const;

  struct Classification;  // one classify() walk (token_classify.cpp)
  void classify_walk(Classification& c, int32_t node, int32_t depth, int32_t state) const;
  // Edge e of a node at byte depth `depth`, from `state`.
  void classify_edge(Classification& c, uint32_t e, int32_t depth, int32_t state) const;
  // Below a node whose state starts a chain of code points (each non-ASCII one, and the chain's
  // ASCII bytes at that level, lead to the chain's next state; TokenTrie::Chain): the walk
  // follows the chain with bit tests instead of transitions, and leaves it where a byte or a
  // level falls outside. `level`: the code points read since the chain's start; `pending`: the
  // continuation bytes the current one still needs.
  struct Chain;
  // pure: the path so far holds only non-ASCII bytes and ASCII bytes of the chain's class
  // (Classification::pure), whose tokens a class bitmask decided already.
  void chain_walk(Classification& c, const Chain& chain, int32_t node, int32_t depth, int level, int pending,
                  bool pure) const;

  // The tokens made only of well-formed UTF-8 whose ASCII bytes are in `ascii` (and with no
  // non-ASCII code point unless `wide`), by their number of code points: bits[L - 1] holds those
  // of at most L (L = 1 up to the longest of them; none when there are none), in the bitmask
  // layout.
  // A JSON string's body takes them all up to its remaining length, so a classification ORs one
  // in instead of setting a bit per token. Built on first use for each class and kept, shared by
  // every grammar over the vocabulary (thread-safe).
  const std::vector<std::vector<uint32_t>>& class_bits(const std::array<uint64_t, 2>& ascii, bool wide) const;
  int max_cp_ = 0;  // the most code points of a token
  struct ClassBitsCache;
  std::unique_ptr<ClassBitsCache> class_bits_;
  void collect(int32_t node, const std::vector<int32_t>& open, std::vector<std::pair<int32_t, int32_t>>& out) const;
};

}  // namespace specula::grammar
