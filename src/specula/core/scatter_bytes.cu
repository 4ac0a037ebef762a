// scatter_bytes: one block per destination.
#include "specula/core/scatter_bytes.h"

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels {

namespace {

// 16-byte words where the destination allows them (source offsets are 16-aligned), bytes after.
__global__ void scatter_kernel(const ScatterParams p) {
  pdl_wait();
  pdl_trigger();
  const int e = static_cast<int>(blockIdx.x);
  const unsigned char* src = p.src + p.offset[e];
  unsigned char* dst = p.dst[e];
  const uint32_t bytes = p.bytes[e];
  uint32_t done = 0;
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    const uint32_t words = bytes / 16;
    for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
    done = words * 16;
  }
  for (uint32_t i = done + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

void scatter_bytes(const ScatterParams& p, cudaStream_t s) {
  SPECULA_REQUIRE(p.count >= 0 && p.count <= kScatterMax, "scatter_bytes: count " + std::to_string(p.count) +
                                                              " is not valid; it must be in [0, " +
                                                              std::to_string(kScatterMax) + "]");
  if (p.count == 0) return;
  launch_pdl(scatter_kernel, static_cast<unsigned>(p.count), 256, 0, s, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
