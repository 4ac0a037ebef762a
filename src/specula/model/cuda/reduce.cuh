// Block-wide sum for the row kernels of model/cuda (RMSNorm): warp shuffles, then one partial
// per warp through shared memory. Every thread of the block gets the total.
#pragma once

namespace specula::cuda_kernels {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Row kernels launch this many threads for rows this wide: wide rows get more threads so one
// row (a decode step) is not a long serial loop.
inline int row_threads(int width) { return width >= 2048 ? 1024 : 256; }

__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x + 31) / 32;
  float total = 0.0f;
  for (int i = 0; i < warps; ++i) total += partial[i];
  return total;
}

}  // namespace specula::cuda_kernels
