// PagedTokenAllocator: hands out KV-cache token slots in pages of page_size tokens (any power of
// two >= 1; page_size 1 is SGLang's TokenToKVPoolAllocator, larger ones its
// PagedTokenToKVPoolAllocator). Page 0 (slots [0, page_size)) is never handed out: padded
// tokens of a batch write there. Running out is a returned std::nullopt the scheduler acts on
// (evict, retract, wait); nothing is taken then. Freeing a slot that is not allocated is a
// caller bug and throws specula::Error without changing any state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace specula {

class PagedTokenAllocator {
 public:
  // capacity_tokens: usable token slots (rounded down to whole pages).
  PagedTokenAllocator(int64_t capacity_tokens, int page_size);

  int page_size() const { return page_size_; }
  int64_t num_pages() const { return num_pages_; }
  // Slots the KV pool must hold: the usable pages plus the reserved page 0.
  int64_t total_slots() const { return (num_pages_ + 1) * page_size_; }
  int64_t available_size() const { return num_free_pages() * page_size_; }  // in tokens
  int64_t num_free_pages() const {
    return static_cast<int64_t>(free_pages_.size() - free_head_ + released_pages_.size());
  }

  // Slots of num_tokens / page_size whole pages; num_tokens must be a multiple of page_size.
  std::optional<std::vector<int32_t>> alloc(int64_t num_tokens);

  // For each request i, tokens [prefix_lens[i], seq_lens[i]) get slots. A request whose prefix
  // ends inside a page continues that page right after last_locs[i] (the slot of its token
  // prefix_lens[i] - 1), then takes new pages. Returns the slots of all new tokens, request
  // after request (out_cache_loc).
  std::optional<std::vector<int32_t>> alloc_extend(std::span<const int32_t> prefix_lens,
                                                   std::span<const int32_t> seq_lens,
                                                   std::span<const int32_t> last_locs);
  // One token per request; seq_lens count it already (SGLang's convention), so the new token is
  // token seq_lens[i] - 1, placed after last_locs[i] unless it starts a new page.
  std::optional<std::vector<int32_t>> alloc_decode(std::span<const int32_t> seq_lens,
                                                   std::span<const int32_t> last_locs);

  // Frees the pages that contain these slots (several slots of one page free it once).
  void free(std::span<const int32_t> slots);
  void clear();

 private:
  int64_t page_of(int32_t slot) const { return slot / page_size_; }
  std::optional<std::vector<int32_t>> take_pages(int64_t count);
  void check_last_loc(int32_t prefix_len, int32_t last_loc, size_t request) const;

  int page_size_;
  int64_t num_pages_;
  // Free pages handed out from the front; freed pages collect in released_pages_ and are merged
  // back (sorted, so allocation stays low-address-first and deterministic) when needed.
  std::vector<int32_t> free_pages_;
  size_t free_head_ = 0;
  std::vector<int32_t> released_pages_;
  std::vector<uint8_t> page_in_use_;  // indexed by page id, page 0 included
};

}  // namespace specula
