// ReqToTokenPool (SGLang's memory_pool.ReqToTokenPool): a table of request slots, each a row of
// max_context_len KV-cache token locations. Row r, column j holds the KV slot of token j of the
// request that owns slot r. Running out of request slots is a returned failure.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "specula/core/tensor.h"

namespace specula {

class ReqToTokenPool {
 public:
  ReqToTokenPool(int size, int max_context_len);

  int size() const { return size_; }
  int max_context_len() const { return max_context_len_; }
  int available_size() const { return static_cast<int>(free_slots_.size()); }

  // n request slots, or nullopt when fewer than n are free (nothing is taken then).
  std::optional<std::vector<int32_t>> alloc(int n);
  // Returns a slot; freeing a slot that is not allocated throws specula::Error.
  void free(int32_t req_pool_index);
  void clear();

  // Writes token locations for positions [start, start + locs.size()) of a request slot.
  void write(int32_t req_pool_index, int start, std::span<const int32_t> locs);
  const int32_t* row(int32_t req_pool_index) const;
  // The whole table, i32 [size, max_context_len], for backends that build page tables from it.
  TensorView req_to_token() const { return table_.view(); }

 private:
  void check_slot(int32_t req_pool_index) const;

  int size_;
  int max_context_len_;
  Buffer table_;
  std::vector<int32_t> free_slots_;
  std::vector<uint8_t> in_use_;
};

}  // namespace specula
