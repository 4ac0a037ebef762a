// copy_slots kernel: one block per buffer; the block's threads copy one row at a time, in move
// order, with a barrier between moves so that a move never overwrites a row an earlier move has
// still to read.
#include "specula/kv/cuda/copy_slots.h"

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels {

namespace {

__global__ void copy_slots_kernel(CopySlotsParams p) {
  pdl_wait();
  pdl_trigger();
  auto* base = static_cast<unsigned char*>(p.buffers[blockIdx.x]);
  const int64_t row = p.row_bytes[blockIdx.x];
  for (int m = 0; m < p.num_moves; ++m) {
    const unsigned char* from = base + static_cast<int64_t>(p.src[m]) * row;
    unsigned char* to = base + static_cast<int64_t>(p.dst[m]) * row;
    // Rows are whole numbers of 4-byte words for every cache dtype and head_dim in use; copy words.
    if (row % 4 == 0) {
      for (int64_t i = threadIdx.x; i < row / 4; i += blockDim.x) {
        reinterpret_cast<uint32_t*>(to)[i] = reinterpret_cast<const uint32_t*>(from)[i];
      }
    } else {
      for (int64_t i = threadIdx.x; i < row; i += blockDim.x) to[i] = from[i];
    }
    __syncthreads();
  }
}

}  // namespace

void launch_copy_slots(const CopySlotsParams& params, cudaStream_t stream) {
  if (params.num_moves == 0 || params.num_buffers == 0) return;
  launch_pdl(copy_slots_kernel, params.num_buffers, 256, 0, stream, params);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
