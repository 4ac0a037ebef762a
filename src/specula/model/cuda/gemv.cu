// gemv_bf16: one warp per output feature; lanes stride over the row in 8-element (16-byte)
// chunks, four chunks in flight per lane, then a warp reduction per activation row.
#include <cuda_bf16.h>

#include <string>

#include "specula/core/cuda_check.h"
#include "specula/model/cuda/gemv.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;

// A streaming 16-byte load: read once, so it need not displace the activations in L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Two bf16 in one 32-bit word -> two f32 (exact: bf16 is the top half of an f32).
__device__ __forceinline__ float lo_bf16(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }

template <int kRows>
__device__ __forceinline__ void accumulate(const uint4& wv, const float* x, int in, int chunk, float (&acc)[kRows]) {
  const float w[8] = {lo_bf16(wv.x), hi_bf16(wv.x), lo_bf16(wv.y), hi_bf16(wv.y),
                      lo_bf16(wv.z), hi_bf16(wv.z), lo_bf16(wv.w), hi_bf16(wv.w)};
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + static_cast<int64_t>(r) * in) + chunk * 2;
    const float4 a = xr[0], b = xr[1];
    acc[r] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
  }
}

template <int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(const uint4* __restrict__ w, const float* __restrict__ x,
                                                                  float* __restrict__ y, int in, int out) {
  const int feature = blockIdx.x * kWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (feature >= out) return;
  const int chunks = in / 8;
  const uint4* row = w + static_cast<int64_t>(feature) * chunks;
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  int c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = load_stream(row + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate<kRows>(wv[u], x, in, c + 32 * u, acc);
  }
  for (; c < chunks; c += 32) accumulate<kRows>(load_stream(row + c), x, in, c, acc);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) y[static_cast<int64_t>(r) * out + feature] = acc[r];
  }
}

template <int kRows>
void launch(const void* w, const float* x, float* y, int in, int out, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  gemv_kernel<kRows><<<blocks, kWarpsPerBlock * 32, 0, s>>>(static_cast<const uint4*>(w), x, y, in, out);
}

}  // namespace

void gemv_bf16(const void* w, const float* x, float* y, int rows, int in, int out, cudaStream_t s) {
  SPECULA_REQUIRE(rows >= 1 && rows <= kGemvMaxRows && in % 8 == 0 && out >= 1,
                  "gemv_bf16: rows " + std::to_string(rows) + ", in " + std::to_string(in) + ", out " +
                      std::to_string(out) + ": rows must be 1..8, in a multiple of 8 and out >= 1");
  switch (rows) {
    case 1: launch<1>(w, x, y, in, out, s); break;
    case 2: launch<2>(w, x, y, in, out, s); break;
    case 3: launch<3>(w, x, y, in, out, s); break;
    case 4: launch<4>(w, x, y, in, out, s); break;
    case 5: launch<5>(w, x, y, in, out, s); break;
    case 6: launch<6>(w, x, y, in, out, s); break;
    case 7: launch<7>(w, x, y, in, out, s); break;
    default: launch<8>(w, x, y, in, out, s); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
