// RadixCache (SGLang's mem_cache/radix_cache.py): a prefix cache over the paged KV cache. It maps
// key sequences to the KV slots that hold their keys and values, so a request whose prompt
// starts like an earlier one reuses that KV instead of recomputing it. Keys and slots are stored
// in whole pages (a partial page is never shared, because a page is the allocator's unit of
// freeing). The scheduler locks the nodes its running requests read from; everything else is
// evicted least-recently-used first when the allocator runs short.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "specula/kv/token_allocator.h"

namespace specula {

struct RadixNode;  // opaque to callers

// One position of a key: the token id, or under speculative decoding the bigram of the token and
// the next one (KvLedger), because the draft KV of a position also depends on the next token.
using RadixKey = int64_t;

class RadixCache {
 public:
  // page_size: keys and values are stored in whole pages; every key length given to insert must
  // be a multiple of it. It must equal the allocator's page size.
  RadixCache(PagedTokenAllocator& allocator, int page_size);
  ~RadixCache();  // does not free slots
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  RadixNode* root() const { return root_.get(); }
  int page_size() const { return page_size_; }

  struct Match {
    std::vector<int32_t> slots;  // KV slots of the longest cached prefix of key, a multiple of page_size
    RadixNode* last_node;        // deepest node of the match (root() when nothing matched)
  };
  // Longest cached prefix of key, truncated down to whole pages. Refreshes the LRU time of every
  // node on the path. Splits a node when the match ends inside it, so last_node covers exactly
  // the matched prefix; lock it while the slots are in use.
  Match match_prefix(std::span<const RadixKey> key);

  // Adds key -> slots (same length, a multiple of page_size). Returns how many leading tokens of
  // key were already cached: the caller's slots for [0, returned) are duplicates it must free
  // itself (except those it got from match_prefix, which are the tree's own). The tree adopts
  // slots[returned, end).
  int64_t insert(std::span<const RadixKey> key, std::span<const int32_t> slots);

  // inc counts one more user of node and of every ancestor up to (not including) root; dec undoes
  // it. Locked nodes are never evicted. Locking root is a no-op.
  void inc_lock_ref(RadixNode* node);
  void dec_lock_ref(RadixNode* node);

  // Frees least-recently-used unlocked leaves (whole nodes; a freed node's parent becomes a
  // candidate once it is a leaf) until at least num_tokens tokens were freed or nothing evictable
  // is left. Returns the tokens freed.
  int64_t evict(int64_t num_tokens);

  int64_t evictable_size() const { return evictable_size_; }  // tokens in unlocked nodes
  int64_t protected_size() const { return protected_size_; }  // tokens in locked nodes
  int64_t total_size() const { return evictable_size_ + protected_size_; }

  // Frees every cached slot and empties the tree; throws specula::Error if any node is locked.
  void reset();

 private:
  RadixNode* split(RadixNode* node, size_t prefix_len);
  void touch(RadixNode* node);

  PagedTokenAllocator& allocator_;
  int page_size_;
  std::unique_ptr<RadixNode> root_;
  uint64_t clock_ = 0;  // LRU time: a counter, not wall time, so eviction order is reproducible
  int64_t evictable_size_ = 0;
  int64_t protected_size_ = 0;
};

}  // namespace specula
