// Device helpers shared by double sparsity's kernels (ds_kernels.cu, ds_select.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "specula/attention/double_sparsity/ds_kernels.h"

namespace specula::ds_cuda {

constexpr int kMaxLabelChannels = 128;

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

__device__ __forceinline__ bool row_is_sparse(int len, const SparseDecode& p) {
  return len >= p.sparse_decode_threshold && len > p.heavy_token_num;
}

// The cache row of request b's token j.
__device__ __forceinline__ int slot_of(const SparseDecode& p, int b, int j) {
  return p.pages[static_cast<int64_t>(b) * p.max_pages + j / p.page_size] * p.page_size + j % p.page_size;
}

// A float's bits as an unsigned key of the same order (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The heavy tokens of every sparse row (ds_select.cu): p.selected[row] gets the cache rows of the
// heavy_token_num tokens with the largest label scores, ties to the lower position, in position
// order.
void select_heavy_tokens(const SparseDecode& p, void* stream);

// How select_heavy_tokens runs rows of up to max_kv_len positions: blocks per row (a cluster of
// 2, 4 or 8), the keys per block kept in shared memory (0: they go to p.scores instead) and whether
// their cache rows are kept there too.
struct SelectPlan {
  int cluster = 8;
  int cached_keys = 0;
  bool cache_slots = false;
};
SelectPlan select_plan(int rows, int max_kv_len, int num_sms);

}  // namespace specula::ds_cuda
