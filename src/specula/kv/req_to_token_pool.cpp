// ReqToTokenPool implementation.
#include "specula/kv/req_to_token_pool.h"

#include <algorithm>
#include <cstring>

namespace specula {

ReqToTokenPool::ReqToTokenPool(int size, int max_context_len)
    : size_(size), max_context_len_(max_context_len) {
  SPECULA_CHECK(size >= 1, "ReqToTokenPool size {} is not valid; it must be at least 1", size);
  SPECULA_CHECK(max_context_len >= 1, "max_context_len {} is not valid; it must be at least 1",
                max_context_len);
  table_ = Buffer(DType::i32, {size, max_context_len});
  table_.zero();
  in_use_.assign(static_cast<size_t>(size), 0);
  clear();
}

std::optional<std::vector<int32_t>> ReqToTokenPool::alloc(int n) {
  SPECULA_CHECK(n >= 0, "cannot allocate {} request slots", n);
  if (n > available_size()) return std::nullopt;
  std::vector<int32_t> out(free_slots_.begin(), free_slots_.begin() + n);
  free_slots_.erase(free_slots_.begin(), free_slots_.begin() + n);
  for (int32_t s : out) in_use_[static_cast<size_t>(s)] = 1;
  return out;
}

void ReqToTokenPool::free(int32_t req_pool_index) {
  check_slot(req_pool_index);
  SPECULA_CHECK(in_use_[static_cast<size_t>(req_pool_index)], "request slot {} is already free",
                req_pool_index);
  in_use_[static_cast<size_t>(req_pool_index)] = 0;
  free_slots_.push_back(req_pool_index);
}

void ReqToTokenPool::clear() {
  free_slots_.resize(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) free_slots_[static_cast<size_t>(i)] = i;
  std::fill(in_use_.begin(), in_use_.end(), 0);
}

void ReqToTokenPool::write(int32_t req_pool_index, int start, std::span<const int32_t> locs) {
  check_slot(req_pool_index);
  SPECULA_CHECK(start >= 0 && start + static_cast<int64_t>(locs.size()) <= max_context_len_,
                "token range [{}, {}) is outside the context of {} tokens", start,
                start + static_cast<int64_t>(locs.size()), max_context_len_);
  int32_t* dst = table_.data_as<int32_t>() + static_cast<int64_t>(req_pool_index) * max_context_len_ + start;
  std::memcpy(dst, locs.data(), locs.size() * sizeof(int32_t));
}

const int32_t* ReqToTokenPool::row(int32_t req_pool_index) const {
  check_slot(req_pool_index);
  return table_.data_as<int32_t>() + static_cast<int64_t>(req_pool_index) * max_context_len_;
}

void ReqToTokenPool::check_slot(int32_t req_pool_index) const {
  SPECULA_CHECK(req_pool_index >= 0 && req_pool_index < size_,
                "request slot {} is out of range [0, {})", req_pool_index, size_);
}

}  // namespace specula
