// Stores of output elements, whose dtype (bf16, f16 or f32) is a run-time code: a branch per element is
// far cheaper than doubling every kernel's instantiations for the output alone.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "specula/core/dtype_codes.h"

namespace specula::cuda_kernels {

__device__ __forceinline__ void store_io(void* base, int32_t dtype, int64_t index, float value) {
  if (dtype == kBF16) {
    static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
  } else if (dtype == kF32) {
    static_cast<float*>(base)[index] = value;
  } else {
    static_cast<__half*>(base)[index] = __float2half_rn(value);
  }
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace specula::cuda_kernels
