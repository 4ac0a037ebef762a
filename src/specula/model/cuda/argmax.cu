// One block per row: each thread keeps the first maximum of its strided elements (ascending, so
// `>` keeps the lowest index on ties and skips NaN), then warps and the block reduce by (larger
// value, then lower index).
#include <climits>
#include <cstdint>
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/score_order.cuh"
#include "specula/model/cuda/argmax.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ void keep_better(float& value, int& index, float other_value, int other_index) {
  if (score_before(other_value, other_index, value, index)) {
    value = other_value;
    index = other_index;
  }
}

// allowed (optional): the row's allowed tokens, a bit each (token j: bit j % 32 of word j / 32).
__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* __restrict__ x, int width,
                                                          const uint32_t* __restrict__ allowed, int words, int32_t* out,
                                                          float* values) {
  pdl_wait();
  pdl_trigger();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * width;
  const uint32_t* row_allowed = allowed != nullptr ? allowed + static_cast<int64_t>(blockIdx.x) * words : nullptr;
  float best = -__builtin_huge_valf();
  int index = INT_MAX;
  auto consider = [&](float v, int j) {
    if (v > best && (row_allowed == nullptr || (row_allowed[j / 32] >> (j % 32) & 1u) != 0)) {
      best = v;
      index = j;
    }
  };
  // Rows of a multiple of four values from an aligned base start 16-byte aligned: float4 loads,
  // four in flight.
  const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const int quads = aligned && width % 4 == 0 ? width / 4 : 0;
  const float4* row4 = reinterpret_cast<const float4*>(row);
#pragma unroll 4
  for (int q = static_cast<int>(threadIdx.x); q < quads; q += kThreads) {
    const float4 v = row4[q];
    consider(v.x, 4 * q);
    consider(v.y, 4 * q + 1);
    consider(v.z, 4 * q + 2);
    consider(v.w, 4 * q + 3);
  }
  for (int j = 4 * quads + static_cast<int>(threadIdx.x); j < width; j += kThreads) consider(row[j], j);

#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    keep_better(best, index, __shfl_xor_sync(0xffffffffu, best, offset), __shfl_xor_sync(0xffffffffu, index, offset));
  }
  __shared__ float warp_best[kThreads / 32];
  __shared__ int warp_index[kThreads / 32];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    warp_best[warp] = best;
    warp_index[warp] = index;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) keep_better(best, index, warp_best[w], warp_index[w]);
  out[blockIdx.x] = best > -__builtin_huge_valf() ? index : -1;
  if (values != nullptr) values[blockIdx.x] = best;
}

}  // namespace

void argmax_rows(const float* x, int64_t rows, int width, int32_t* out, cudaStream_t s, const uint32_t* allowed,
                 float* values) {
  if (rows == 0) return;
  SPECULA_REQUIRE(width >= 1, "argmax_rows: width " + std::to_string(width) + "; it must be at least 1");
  launch_pdl(argmax_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, width, allowed, (width + 31) / 32, out, values);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
