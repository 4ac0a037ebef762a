#include "specula/core/cuda_check.h"
#include "specula/core/l2_flush.h"

namespace specula::cuda_kernels {

namespace {

__global__ void read_through_kernel(const uint4* src, size_t count, unsigned* sink) {
  unsigned acc = 0;
#pragma unroll 8
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

void read_through_l2(const void* src, size_t bytes, unsigned* sink, cudaStream_t s) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  read_through_kernel<<<sms * 4, 512, 0, s>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
