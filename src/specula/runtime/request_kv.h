// The per-request KV ledger: which KV slots a request holds (its row in the request table, the
// slots of its tokens, the prefix-cache pages it reads and the lock on them, a speculative
// cycle's scratch), and every move of those slots between the request, the paged allocator and
// the radix prefix cache. The scheduler decides when; KvLedger keeps the books straight.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "specula/kv/radix_cache.h"
#include "specula/runner/model_runner.h"
#include "specula/speculative/draft_head.h"

namespace specula {

// A request's tokens without a copy: its prompt followed by its output so far (the "fill").
// The prefix cache's keys are leading runs of it.
struct FillTokens {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;

  int size() const { return static_cast<int>(prompt.size() + output.size()); }
  int32_t operator[](int i) const {
    const auto p = static_cast<int>(prompt.size());
    return i < p ? prompt[static_cast<size_t>(i)] : output[static_cast<size_t>(i - p)];
  }
};

// The KV a request holds. Slots [0, prefix_len) are prefix-cache pages, read under a lock on
// last_node; slots [prefix_len, len()) are the request's own.
struct RequestKv {
  int32_t req_pool_idx = -1;       // its row in the request table; -1 while it holds none
  std::vector<int32_t> slots;      // KV slots of fill tokens [0, len())
  int prefix_len = 0;              // leading slots owned by the prefix cache (whole pages)
  RadixNode* last_node = nullptr;  // the matched node, locked while set
  // Speculative decoding: the draft KV exists for pairs [0, draft_len) (less than len() after
  // steps with speculation off); the root's draft state; the scratch slots of the running cycle
  // (positions len()...).
  int draft_len = 0;
  DraftState draft;
  std::vector<int32_t> scratch;

  int len() const { return static_cast<int>(slots.size()); }
  int32_t last_slot() const { return slots.empty() ? -1 : slots.back(); }
};

class KvLedger {
 public:
  // speculative: a request's KV may be cached only where its draft KV was computed too.
  KvLedger(ModelRunner& runner, bool radix_cache, bool speculative);
  ~KvLedger();
  KvLedger(const KvLedger&) = delete;
  KvLedger& operator=(const KvLedger&) = delete;

  RadixCache* cache() const { return cache_.get(); }
  int page_size() const { return runner_.page_size(); }
  // Pages a request whose KV holds `len` tokens needs for `tokens` more (its last page may have room).
  int64_t new_pages(int len, int tokens) const;
  // Tokens rounded up to whole pages.
  int64_t whole_pages_tokens(int64_t tokens) const;
  // Tokens that could be allocated now: free, plus what the prefix cache could give up.
  int64_t obtainable_tokens() const;
  // Makes `pages` free pages available, evicting unlocked prefix-cache pages if needed.
  bool ensure_free_pages(int64_t pages);

  // Sets kv to the longest cached prefix of fill (all but its last token, which must run so that
  // its logits give the next token) and locks it. kv holds no request row yet.
  void match_prefix(RequestKv& kv, const FillTokens& fill);
  // Drops the lock on kv's prefix and forgets its slots: a request that was matched but is not
  // admitted, or whose slots were just handed back.
  void unlock_prefix(RequestKv& kv);
  // Takes a request-table row for an admitted request and maps its matched prefix into it.
  void take_row(RequestKv& kv);
  // Slots for `extend` more tokens (evicting cache pages if needed); false when there are none
  // (nothing is taken then).
  bool alloc_extend(RequestKv& kv, int extend);
  bool alloc_decode(RequestKv& kv);
  // A speculative cycle's `tokens` scratch slots past kv's KV: mapped in its row, kept in
  // kv.scratch, not (yet) its KV. The caller made the pages free (ensure_free_pages).
  void alloc_scratch(RequestKv& kv, int tokens);
  // Frees the pages of `slots` (positions after a request's last kept slot `last_kept`, -1 for
  // none) that do not also hold kept tokens.
  void free_after(std::span<const int32_t> slots, int32_t last_kept);

  // Hands a request's KV to the prefix cache (the page-aligned part) or frees it, and its row.
  // cache_kv = false frees the request's own slots without caching them (their contents are not
  // trustworthy after a failed step). A request without a row holds nothing: a no-op.
  void release(RequestKv& kv, const FillTokens& fill, bool cache_kv);
  // After a prefill chunk: its page-aligned KV joins the prefix cache so others can share it,
  // and the request reads the cache's copy from then on.
  void cache_unfinished(RequestKv& kv, const FillTokens& fill);

  int64_t free_tokens() const { return runner_.allocator().available_size(); }
  int64_t cached_tokens() const { return cache_ ? cache_->total_size() : 0; }
  int64_t total_tokens() const { return runner_.allocator().num_pages() * runner_.page_size(); }
  // Frees every prefix-cache page (only while no request holds any).
  void flush_cache();

 private:
  // KV tokens a request may hand to the prefix cache (with speculation, only those whose draft
  // KV was computed too), rounded down to whole pages: a partial page is never shared.
  int cacheable_len(const RequestKv& kv, const FillTokens& fill) const;
  // The cache key of fill's positions [0, n): token ids, or under speculation bigrams (RadixKey).
  std::vector<RadixKey> key(const FillTokens& fill, int n) const;
  // Inserts key -> kv.slots[0, key.size()) into the cache and frees the request's own slots the
  // cache already had (computed twice).
  void insert(RequestKv& kv, const std::vector<RadixKey>& key);

  ModelRunner& runner_;
  bool speculative_;
  std::unique_ptr<RadixCache> cache_;
};

}  // namespace specula
