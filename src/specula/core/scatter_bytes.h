// scatter_bytes: copies of byte ranges of one device buffer to many device destinations in one
// launch per kScatterMax destinations (UploadBatch's second half). Raw pointers; graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

constexpr int kScatterMax = 16;

struct ScatterParams {
  const unsigned char* src;  // offsets are multiples of 16 bytes
  int count;                 // <= kScatterMax
  unsigned char* dst[kScatterMax];
  uint32_t offset[kScatterMax];
  uint32_t bytes[kScatterMax];
};
void scatter_bytes(const ScatterParams& p, cudaStream_t s);

}  // namespace specula::cuda_kernels
