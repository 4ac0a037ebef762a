// e4m3 expert weights as bf16 tensor-core operands (moe_gemm's kernels): each value is
// bf16(code x scale), rounded once, which is what dequantizing the checkpoint to bf16 on the
// host gives, so fp8-held experts multiply bit for bit as their bf16 dequantization does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace specula::cuda_kernels {

// Two codes (the lower byte first) times scale as a bf16 pair.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t codes, float scale) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&raw));
  const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
  return *reinterpret_cast<const uint32_t*>(&b);
}

}  // namespace specula::cuda_kernels
