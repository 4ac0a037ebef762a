// The per-request KV ledger (request_kv.h): allocation, prefix matching, caching and release of
// a request's KV slots. Slot positions follow pages: alloc_extend continues a request's last page,
// so the slot of position p sits at offset p % page_size of its page, and a page-aligned position
// always starts a page of its own.
#include "specula/runtime/request_kv.h"

#include <algorithm>

#include "specula/core/error.h"

namespace specula {


KvLedger::KvLedger(ModelRunner& runner, bool radix_cache, bool speculative)
    : runner_(runner), speculative_(speculative) {
  if (radix_cache) cache_ = std::make_unique<RadixCache>(runner_.allocator(), runner_.page_size());
}

KvLedger::~KvLedger() = default;

int64_t KvLedger::whole_pages_tokens(int64_t tokens) const {
  const int64_t page = page_size();
  return (tokens + page - 1) / page * page;
}

int64_t KvLedger::new_pages(int len, int tokens) const {
  return (whole_pages_tokens(len + tokens) - whole_pages_tokens(len)) / page_size();
}

int64_t KvLedger::obtainable_tokens() const {
  return runner_.allocator().available_size() + (cache_ ? cache_->evictable_size() : 0);
}

bool KvLedger::ensure_free_pages(int64_t pages) {
  PagedTokenAllocator& a = runner_.allocator();
  if (a.num_free_pages() >= pages) return true;
  if (cache_) cache_->evict((pages - a.num_free_pages()) * a.page_size());
  return a.num_free_pages() >= pages;
}

void KvLedger::unlock_prefix(RequestKv& kv) {
  if (cache_ && kv.last_node != nullptr) cache_->dec_lock_ref(kv.last_node);
  kv.slots.clear();
  kv.prefix_len = 0;
  kv.last_node = nullptr;
}

std::vector<RadixKey> KvLedger::key(const FillTokens& fill, int n) const {
  SPECULA_ASSERT(n >= 0 && n + (speculative_ ? 1 : 0) <= fill.size(), "a cache key of {} positions over {} tokens", n,
                 fill.size());
  std::vector<RadixKey> key(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    // Under speculation the draft pair of position i is (its target feature, token i + 1), so the
    // KV of a position is shared only between sequences that agree on the next token as well
    // (SGLang's EAGLE bigram keys): otherwise a request would read another one's draft pair where
    // their tokens diverge.
    key[static_cast<size_t>(i)] =
        speculative_ ? static_cast<RadixKey>((static_cast<uint64_t>(static_cast<uint32_t>(fill[i])) << 32) |
                                             static_cast<uint32_t>(fill[i + 1]))
                     : fill[i];
  }
  return key;
}

void KvLedger::match_prefix(RequestKv& kv, const FillTokens& fill) {
  SPECULA_ASSERT(kv.req_pool_idx < 0, "only a waiting request is matched against the prefix cache");
  unlock_prefix(kv);
  if (!cache_) return;
  RadixCache::Match m = cache_->match_prefix(key(fill, fill.size() - 1));
  kv.slots = std::move(m.slots);
  kv.prefix_len = kv.len();
  kv.draft_len = kv.prefix_len;
  kv.last_node = m.last_node;
  cache_->inc_lock_ref(kv.last_node);
}

void KvLedger::take_row(RequestKv& kv) {
  // The scheduler admits at most max_running_requests, the number of rows.
  std::optional<std::vector<int32_t>> row = runner_.req_pool().alloc(1);
  SPECULA_ASSERT(row.has_value(), "no free request row for an admitted request");
  kv.req_pool_idx = row->at(0);
  if (kv.prefix_len > 0) runner_.req_pool().write(kv.req_pool_idx, 0, kv.slots);
}

bool KvLedger::alloc_extend(RequestKv& kv, int extend) {
  const int len = kv.len();
  if (!ensure_free_pages(new_pages(len, extend))) return false;
  const int32_t prefix[] = {len}, seq[] = {len + extend}, last[] = {kv.last_slot()};
  std::optional<std::vector<int32_t>> slots = runner_.allocator().alloc_extend(prefix, seq, last);
  SPECULA_ASSERT(slots.has_value(), "{} free pages were made available for {} tokens", new_pages(len, extend), extend);
  runner_.req_pool().write(kv.req_pool_idx, len, *slots);
  kv.slots.insert(kv.slots.end(), slots->begin(), slots->end());
  return true;
}

bool KvLedger::alloc_decode(RequestKv& kv) {
  const int len = kv.len();
  if (!ensure_free_pages(new_pages(len, 1))) return false;
  const int32_t seq[] = {len + 1}, last[] = {kv.last_slot()};
  std::optional<std::vector<int32_t>> slot = runner_.allocator().alloc_decode(seq, last);
  SPECULA_ASSERT(slot.has_value(), "a free page was made available for a decode token");
  runner_.req_pool().write(kv.req_pool_idx, len, *slot);
  kv.slots.push_back((*slot)[0]);
  return true;
}

void KvLedger::alloc_scratch(RequestKv& kv, int tokens) {
  const int len = kv.len();
  const int32_t prefix[] = {len}, seq[] = {len + tokens}, last[] = {kv.last_slot()};
  std::optional<std::vector<int32_t>> slots = runner_.allocator().alloc_extend(prefix, seq, last);
  SPECULA_ASSERT(slots.has_value(), "the caller made pages free for {} scratch tokens", tokens);
  runner_.req_pool().write(kv.req_pool_idx, len, *slots);
  kv.scratch = std::move(*slots);
}

void KvLedger::free_after(std::span<const int32_t> slots, int32_t last_kept) {
  const int page = page_size();
  std::vector<int32_t> pages;
  for (int32_t slot : slots) {
    if (last_kept >= 0 && slot / page == last_kept / page) continue;
    if (pages.empty() || pages.back() != slot / page) pages.push_back(slot / page);
  }
  for (int32_t& p : pages) p *= page;
  runner_.allocator().free(pages);
}

int KvLedger::cacheable_len(const RequestKv& kv, const FillTokens& fill) const {
  // A speculative key position needs the token after it too.
  const int len = speculative_ ? std::min({kv.len(), kv.draft_len, fill.size() - 1}) : kv.len();
  return len / page_size() * page_size();
}

void KvLedger::insert(RequestKv& kv, const std::vector<RadixKey>& key) {
  const int64_t overlap = cache_->insert(key, std::span<const int32_t>(kv.slots).first(key.size()));
  // The request's prefix came from the cache, so the cache has at least that much of the key.
  SPECULA_ASSERT(overlap >= kv.prefix_len, "cache overlap {} < the request's prefix {}", overlap, kv.prefix_len);
  if (overlap > kv.prefix_len) {
    runner_.allocator().free(std::span<const int32_t>(kv.slots).subspan(
        static_cast<size_t>(kv.prefix_len), static_cast<size_t>(overlap - kv.prefix_len)));
  }
}

void KvLedger::release(RequestKv& kv, const FillTokens& fill, bool cache_kv) {
  if (kv.req_pool_idx < 0) return;
  const int len = kv.len();
  // Slots [0, kept) stay with the prefix cache; the rest (the unaligned tail, or everything the
  // request computed when its KV is not trusted) go back to the allocator.
  int kept = 0;
  if (cache_) {
    kept = cache_kv ? cacheable_len(kv, fill) : kv.prefix_len;
    // Slots below prefix_len belong to the cache: freeing any of them would corrupt it.
    SPECULA_ASSERT(kept >= kv.prefix_len, "a request keeps {} KV slots but the cache owns its first {}", kept,
                   kv.prefix_len);
    if (cache_kv && kept > 0) insert(kv, key(fill, kept));
  }
  if (len > kept) runner_.allocator().free(std::span<const int32_t>(kv.slots).subspan(static_cast<size_t>(kept)));
  kv.draft = {};
  kv.draft_len = 0;
  unlock_prefix(kv);
  runner_.req_pool().free(kv.req_pool_idx);
  kv.req_pool_idx = -1;
}

void KvLedger::cache_unfinished(RequestKv& kv, const FillTokens& fill) {
  if (!cache_) return;
  const int aligned = cacheable_len(kv, fill);
  if (aligned <= kv.prefix_len) return;
  const std::vector<RadixKey> k = key(fill, aligned);
  insert(kv, k);
  // From now on the request reads the cache's copy of those tokens and holds a lock on it.
  RadixCache::Match m = cache_->match_prefix(k);
  SPECULA_ASSERT(static_cast<int>(m.slots.size()) == aligned, "the cache holds {} of the {} tokens just inserted",
                 m.slots.size(), aligned);
  std::copy(m.slots.begin(), m.slots.end(), kv.slots.begin());
  runner_.req_pool().write(kv.req_pool_idx, 0, m.slots);
  cache_->inc_lock_ref(m.last_node);
  if (kv.last_node != nullptr) cache_->dec_lock_ref(kv.last_node);
  kv.last_node = m.last_node;
  kv.prefix_len = aligned;
}

void KvLedger::flush_cache() {
  if (cache_) cache_->reset();
}

}  // namespace specula
