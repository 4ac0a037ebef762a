// Streaming weight loads shared by the decode products (gemv.cu, skinny_gemm.cu).
#pragma once

#include <cstdint>

namespace specula::cuda_kernels {

// A streaming 16-byte load: weights are read once per step, so they need not displace the
// activations in L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace specula::cuda_kernels
