// scatter_bytes: copies of byte ranges of one device buffer to many device destinations in one
// launch per kScatterMax destinations (UploadBatch's second half). Raw pointers; graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

constexpr int kScatterMax = 16;

// Destination i receives src[offset[i], offset[i] + bytes[i]).
struct ScatterParams {
  const unsigned char* src;          // device; 16-byte aligned, as every offset is a multiple of 16
  int count;                         // destinations, <= kScatterMax
  unsigned char* dst[kScatterMax];   // device, any alignment (16-byte ones are copied by words)
  uint32_t offset[kScatterMax];      // into src
  uint32_t bytes[kScatterMax];
};
void scatter_bytes(const ScatterParams& p, cudaStream_t s);

}  // namespace specula::cuda_kernels
