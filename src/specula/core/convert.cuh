// Device-side element conversions shared by the attention, KV-pool and model kernels: loads of bf16 / f16 / f32 /
// fp8-e4m3 to float and packed conversions to the 16-bit MMA operand types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace specula::cuda_kernels {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_fp8_e4m3>(__nv_fp8_e4m3 v) { return static_cast<float>(v); }

// Round-to-nearest-even float -> storage type (matches the host conversions in core/dtype).
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float v) {
  // The cache saturates (see MHAKVPool): an outlier must not become NaN.
  return __nv_fp8_e4m3(fminf(fmaxf(v, -448.0f), 448.0f));
}

// Eight packed fp8 e4m3 values (8 bytes, lowest byte first) -> float, exactly.
__device__ __forceinline__ void fp8x8_to_float(const uint2& raw, float (&dst)[8]) {
  const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<__nv_fp8_storage_t>((words[w] >> (8 * b)) & 0xffu);
      dst[4 * w + b] = static_cast<float>(v);
    }
  }
}

// Two floats -> one packed 32-bit register of the 16-bit MMA type.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Pair i (0..3) of eight packed fp8 e4m3 values as f16, exactly (every e4m3 value is an f16), through
// the paired hardware conversion.
__device__ __forceinline__ __half2_raw fp8_pair_to_half2(const uint2& raw, int i) {
  const uint32_t word = i < 2 ? raw.x : raw.y;
  return __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> (16 * (i % 2))), __NV_E4M3);
}

// Four packed fp8 e4m3 values (lowest byte first) as two packed f16 pairs, exactly.
__device__ __forceinline__ void fp8x4_to_half2x2(uint32_t word, uint32_t (&out)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> (16 * i)), __NV_E4M3);
    out[i] = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  }
}

// Eight packed fp8 e4m3 values -> eight f16 in 16 bytes, exactly.
__device__ __forceinline__ uint4 fp8x8_to_half8(const uint2& raw) {
  uint32_t lo[2], hi[2];
  fp8x4_to_half2x2(raw.x, lo);
  fp8x4_to_half2x2(raw.y, hi);
  return make_uint4(lo[0], lo[1], hi[0], hi[1]);
}

// Eight packed fp8 e4m3 values times their group's scale, each rounded once to bf16 (how the
// MLA kernel turns fp8_ds_mla rows into MMA operands).
__device__ __forceinline__ uint4 fp8x8_scaled_to_bf16(const uint2& raw, float scale) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(__half2(fp8_pair_to_half2(raw, i)));
    out[i] = pack2<__nv_bfloat16>(f.x * scale, f.y * scale);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace specula::cuda_kernels
