// Dual chunk sparse runs (dual_chunk_sparse.h) in the prefill kernels: 64-bit windows of the kept
// column and distance bitmaps, read once per key tile instead of once per score.
#pragma once

#include <cstdint>

namespace specula::cuda_kernels {

// Bits [start, start + 64) of a bitmap of `words` words (bits outside it read as 0).
__device__ __forceinline__ uint64_t bits64(const uint32_t* bitmap, int64_t words, int64_t start) {
  const int64_t w0 = start >= 0 ? start / 32 : -((31 - start) / 32);
  const int shift = static_cast<int>(start - w0 * 32);
  uint32_t w[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const int64_t at = w0 + i;
    w[i] = at >= 0 && at < words ? bitmap[at] : 0u;
  }
  const uint64_t lo = (static_cast<uint64_t>(w[1]) << 32) | w[0];
  return shift == 0 ? lo : (lo >> shift) | (static_cast<uint64_t>(w[2]) << (64 - shift));
}

}  // namespace specula::cuda_kernels
