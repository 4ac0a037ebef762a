// copy_slots on the GPU: moves whole token rows between slots of every K and V buffer of a pool
// (speculative decoding's accepted path), in one launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct CopySlotsParams {
  void* const* buffers;   // [num_buffers] device pointers: each layer's K and V, [num_slots, row_bytes[i]]
  const int64_t* row_bytes;  // [num_buffers]
  int32_t num_buffers;
  const int32_t* src;     // [num_moves] source slots
  const int32_t* dst;     // [num_moves] destination slots
  int32_t num_moves;
};

// Moves run in order within each buffer (a later move may write a slot an earlier one reads).
void launch_copy_slots(const CopySlotsParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
