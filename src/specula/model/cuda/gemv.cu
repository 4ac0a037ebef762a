// gemv_bf16: one warp per output feature; lanes stride over the row in 8-element (16-byte)
// chunks, four chunks in flight per lane, then a warp reduction per activation row.
#include <cuda_bf16.h>

#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
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

// Unpacks 8 bf16 weights.
__device__ __forceinline__ void unpack(const uint4& wv, float (&w)[8]) {
  w[0] = lo_bf16(wv.x), w[1] = hi_bf16(wv.x), w[2] = lo_bf16(wv.y), w[3] = hi_bf16(wv.y);
  w[4] = lo_bf16(wv.z), w[5] = hi_bf16(wv.z), w[6] = lo_bf16(wv.w), w[7] = hi_bf16(wv.w);
}

// One chunk of kFeat weight rows against kRows activation rows. The activations are loaded once
// per chunk and reused for every feature (with one feature per warp, re-reading them per row
// made several rows L1-bound). Each (row, feature) sum adds chunk dot products in ascending
// chunk order whatever kRows and kFeat are, so a row's result does not depend on the batch.
template <int kRows, int kFeat>
__device__ __forceinline__ void accumulate(const uint4 (&wv)[kFeat], const float* x, int in, int chunk,
                                           float (&acc)[kRows][kFeat]) {
  float w[kFeat][8];
#pragma unroll
  for (int f = 0; f < kFeat; ++f) unpack(wv[f], w[f]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + static_cast<int64_t>(r) * in) + chunk * 2;
    const float4 a = xr[0], b = xr[1];
#pragma unroll
    for (int f = 0; f < kFeat; ++f) {
      acc[r][f] += w[f][0] * a.x + w[f][1] * a.y + w[f][2] * a.z + w[f][3] * a.w + w[f][4] * b.x + w[f][5] * b.y +
                   w[f][6] * b.z + w[f][7] * b.w;
    }
  }
}

template <int kRows, int kFeat, int kUnrollChunks>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(const uint4* __restrict__ w, const float* __restrict__ x,
                                                                  float* __restrict__ y, int in, int out) {
  const int first = (blockIdx.x * kWarpsPerBlock + static_cast<int>(threadIdx.x) / 32) * kFeat;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (first >= out) return;
  const int chunks = in / 8;
  // Features past the end read the last row (valid memory) and are not stored.
  const uint4* rows[kFeat];
#pragma unroll
  for (int f = 0; f < kFeat; ++f) rows[f] = w + static_cast<int64_t>(min(first + f, out - 1)) * chunks;
  float acc[kRows][kFeat];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kFeat; ++f) acc[r][f] = 0.0f;
  }
  uint4 wv[kUnrollChunks][kFeat];
  auto load_group = [&](int c) {
#pragma unroll
    for (int u = 0; u < kUnrollChunks; ++u) {
#pragma unroll
      for (int f = 0; f < kFeat; ++f) wv[u][f] = load_stream(rows[f] + c + 32 * u);
    }
  };
  // The weights do not depend on earlier kernels: the first group's loads are issued before
  // waiting for the activations, so they overlap the previous kernel's tail (cuda_pdl.cuh).
  int c = lane;
  bool full = c + 32 * (kUnrollChunks - 1) < chunks;
  if (full) load_group(c);
  pdl_wait();
  pdl_trigger();
  while (full) {
#pragma unroll
    for (int u = 0; u < kUnrollChunks; ++u) accumulate<kRows, kFeat>(wv[u], x, in, c + 32 * u, acc);
    c += 32 * kUnrollChunks;
    full = c + 32 * (kUnrollChunks - 1) < chunks;
    if (full) load_group(c);
  }
  for (; c < chunks; c += 32) {
    uint4 wv[kFeat];
#pragma unroll
    for (int f = 0; f < kFeat; ++f) wv[f] = load_stream(rows[f] + c);
    accumulate<kRows, kFeat>(wv, x, in, c, acc);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kFeat; ++f) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc[r][f] += __shfl_xor_sync(0xffffffffu, acc[r][f], offset);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int f = 0; f < kFeat; ++f) {
        if (first + f < out) y[static_cast<int64_t>(r) * out + first + f] = acc[r][f];
      }
    }
  }
}

// One feature per warp and four chunks in flight for a single row (bandwidth-bound); four
// features per warp sharing the activations for several rows.
template <int kRows>
void launch(const void* w, const float* x, float* y, int in, int out, cudaStream_t s) {
  constexpr int kFeat = kRows == 1 ? 1 : 4;
  constexpr int kUnrollChunks = kRows == 1 ? kUnroll : 1;
  const int per_block = kWarpsPerBlock * kFeat;
  const unsigned blocks = static_cast<unsigned>((out + per_block - 1) / per_block);
  launch_pdl(gemv_kernel<kRows, kFeat, kUnrollChunks>, blocks, kWarpsPerBlock * 32, 0, s, static_cast<const uint4*>(w),
             x, y, in, out);
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
