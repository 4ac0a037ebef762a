// PagedTokenAllocator implementation.
#include "specula/kv/token_allocator.h"

#include <algorithm>

#include "specula/core/error.h"

namespace specula {

PagedTokenAllocator::PagedTokenAllocator(int64_t capacity_tokens, int page_size) : page_size_(page_size) {
  SPECULA_CHECK(page_size >= 1 && (page_size & (page_size - 1)) == 0,
                "page_size {} is not valid; it must be a power of two >= 1", page_size);
  SPECULA_CHECK(capacity_tokens >= page_size,
                "KV capacity of {} tokens is less than one page of {} tokens", capacity_tokens, page_size);
  num_pages_ = capacity_tokens / page_size;
  SPECULA_CHECK((num_pages_ + 1) * page_size <= INT32_MAX,
                "KV capacity of {} tokens exceeds the 32-bit slot range", capacity_tokens);
  clear();
}

void PagedTokenAllocator::clear() {
  free_pages_.resize(static_cast<size_t>(num_pages_));
  for (int64_t p = 0; p < num_pages_; ++p) free_pages_[static_cast<size_t>(p)] = static_cast<int32_t>(p + 1);
  free_head_ = 0;
  released_pages_.clear();
  page_in_use_.assign(static_cast<size_t>(num_pages_ + 1), 0);
  page_in_use_[0] = 1;  // reserved for padding
}

std::optional<std::vector<int32_t>> PagedTokenAllocator::take_pages(int64_t count) {
  if (count > num_free_pages()) return std::nullopt;
  if (static_cast<int64_t>(free_pages_.size() - free_head_) < count) {
    free_pages_.erase(free_pages_.begin(), free_pages_.begin() + static_cast<int64_t>(free_head_));
    free_head_ = 0;
    free_pages_.insert(free_pages_.end(), released_pages_.begin(), released_pages_.end());
    released_pages_.clear();
    std::sort(free_pages_.begin(), free_pages_.end());
  }
  std::vector<int32_t> pages(free_pages_.begin() + static_cast<int64_t>(free_head_),
                             free_pages_.begin() + static_cast<int64_t>(free_head_) + count);
  free_head_ += static_cast<size_t>(count);
  for (int32_t p : pages) page_in_use_[static_cast<size_t>(p)] = 1;
  return pages;
}

std::optional<std::vector<int32_t>> PagedTokenAllocator::alloc(int64_t num_tokens) {
  SPECULA_CHECK(num_tokens >= 0 && num_tokens % page_size_ == 0,
                "alloc of {} tokens is not valid; it must be a non-negative multiple of page_size {}",
                num_tokens, page_size_);
  auto pages = take_pages(num_tokens / page_size_);
  if (!pages) return std::nullopt;
  std::vector<int32_t> slots;
  slots.reserve(static_cast<size_t>(num_tokens));
  for (int32_t p : *pages) {
    for (int i = 0; i < page_size_; ++i) slots.push_back(p * page_size_ + i);
  }
  return slots;
}

void PagedTokenAllocator::check_last_loc(int32_t prefix_len, int32_t last_loc, size_t request) const {
  if (prefix_len == 0) return;
  SPECULA_CHECK(last_loc >= page_size_ && last_loc < total_slots() &&
                    page_in_use_[static_cast<size_t>(page_of(last_loc))],
                "last_loc {} of request {} is not an allocated slot", last_loc, request);
  SPECULA_CHECK(last_loc % page_size_ == (prefix_len - 1) % page_size_,
                "last_loc {} of request {} is at offset {} in its page, but prefix_len {} needs "
                "offset {}", last_loc, request, last_loc % page_size_, prefix_len,
                (prefix_len - 1) % page_size_);
}

std::optional<std::vector<int32_t>> PagedTokenAllocator::alloc_extend(
    std::span<const int32_t> prefix_lens, std::span<const int32_t> seq_lens,
    std::span<const int32_t> last_locs) {
  SPECULA_CHECK(prefix_lens.size() == seq_lens.size() && seq_lens.size() == last_locs.size(),
                "alloc_extend: prefix_lens ({}), seq_lens ({}) and last_locs ({}) differ in length",
                prefix_lens.size(), seq_lens.size(), last_locs.size());
  int64_t new_pages = 0;
  int64_t new_tokens = 0;
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    SPECULA_CHECK(prefix_lens[i] >= 0 && seq_lens[i] >= prefix_lens[i],
                  "request {}: prefix_len {} and seq_len {} are not 0 <= prefix_len <= seq_len", i,
                  prefix_lens[i], seq_lens[i]);
    check_last_loc(prefix_lens[i], last_locs[i], i);
    const int64_t pages_before = (prefix_lens[i] + page_size_ - 1) / page_size_;
    const int64_t pages_after = (seq_lens[i] + page_size_ - 1) / page_size_;
    new_pages += pages_after - pages_before;
    new_tokens += seq_lens[i] - prefix_lens[i];
  }
  auto pages = take_pages(new_pages);
  if (!pages) return std::nullopt;

  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(new_tokens));
  size_t next_page = 0;
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    int32_t slot = last_locs[i];
    for (int32_t t = prefix_lens[i]; t < seq_lens[i]; ++t) {
      // Token t starts a page exactly when t is a multiple of page_size.
      slot = (t % page_size_ == 0) ? (*pages)[next_page++] * page_size_ : slot + 1;
      out.push_back(slot);
    }
  }
  SPECULA_ASSERT(next_page == pages->size());
  return out;
}

std::optional<std::vector<int32_t>> PagedTokenAllocator::alloc_decode(std::span<const int32_t> seq_lens,
                                                                      std::span<const int32_t> last_locs) {
  SPECULA_CHECK(seq_lens.size() == last_locs.size(),
                "alloc_decode: seq_lens ({}) and last_locs ({}) differ in length", seq_lens.size(),
                last_locs.size());
  std::vector<int32_t> prefix_lens(seq_lens.size());
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    SPECULA_CHECK(seq_lens[i] >= 1, "request {}: decode seq_len {} must be at least 1", i, seq_lens[i]);
    prefix_lens[i] = seq_lens[i] - 1;
  }
  return alloc_extend(prefix_lens, seq_lens, last_locs);
}

void PagedTokenAllocator::free(std::span<const int32_t> slots) {
  std::vector<int32_t> pages;
  pages.reserve(slots.size());
  for (int32_t slot : slots) {
    SPECULA_CHECK(slot >= page_size_ && slot < total_slots(),
                  "free of slot {} is out of range; allocatable slots are [{}, {})", slot, page_size_,
                  total_slots());
    pages.push_back(static_cast<int32_t>(page_of(slot)));
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  // Validate everything before changing anything, so a rejected free leaves no trace.
  for (int32_t p : pages) {
    SPECULA_CHECK(page_in_use_[static_cast<size_t>(p)],
                  "free of page {} (slots [{}, {})) which is not allocated (double free?)", p,
                  p * page_size_, (p + 1) * page_size_);
  }
  for (int32_t p : pages) {
    page_in_use_[static_cast<size_t>(p)] = 0;
    released_pages_.push_back(p);
  }
}

}  // namespace specula
