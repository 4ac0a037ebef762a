// DType: the element types specula stores, their sizes and names, and exact scalar conversions
// to and from float32 with round-to-nearest-even (the rounding of PyTorch and of the hardware
// cvt instructions, so a CPU-written cache matches a GPU-written one bit for bit).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specula {

enum class DType : uint8_t { f32, f16, bf16, fp8_e4m3, fp8_e5m2, i32, i64, u8 };

inline constexpr DType kAllDTypes[] = {DType::f32,      DType::f16, DType::bf16, DType::fp8_e4m3,
                                       DType::fp8_e5m2, DType::i32, DType::i64,  DType::u8};

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f32", "bf16", "fp8_e4m3", ...
bool is_floating(DType dtype);
// Parses the names above plus the usual aliases ("float32", "bfloat16", "fp8", "float8_e4m3fn").
// Throws specula::Error listing the accepted names.
DType parse_dtype(std::string_view name);

// Raw storage types: plain bit patterns, so they are trivially copyable and identical on host
// and device.
struct f16_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };
struct fp8_e4m3_t { uint8_t bits; };
struct fp8_e5m2_t { uint8_t bits; };

// float32 -> narrow format, round-to-nearest-even.
//  f16, bf16, e5m2: IEEE-like; overflow gives +-inf, NaN stays NaN.
//  e4m3 ("fn": finite, no inf; 0x7f/0xff are NaN; max 448): overflow and inf give NaN, as
//  PyTorch's float8_e4m3fn cast does. Callers that must not produce NaN (the fp8 KV cache)
//  saturate first with kFp8E4m3Max.
uint16_t float_to_f16_bits(float value);
uint16_t float_to_bf16_bits(float value);
uint8_t float_to_fp8_e4m3_bits(float value);
uint8_t float_to_fp8_e5m2_bits(float value);

float f16_bits_to_float(uint16_t bits);
float fp8_e4m3_bits_to_float(uint8_t bits);
float fp8_e5m2_bits_to_float(uint8_t bits);
inline float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline constexpr float kFp8E4m3Max = 448.0f;

inline float to_float(f16_t v) { return f16_bits_to_float(v.bits); }
inline float to_float(bf16_t v) { return bf16_bits_to_float(v.bits); }
inline float to_float(fp8_e4m3_t v) { return fp8_e4m3_bits_to_float(v.bits); }
inline float to_float(fp8_e5m2_t v) { return fp8_e5m2_bits_to_float(v.bits); }
inline float to_float(float v) { return v; }

// Reads element `index` of a buffer of `dtype` as float (integers convert by value).
float load_as_float(const void* data, DType dtype, size_t index);
// Writes `value` as element `index` of a buffer of `dtype` (round-to-nearest-even for floats;
// integers truncate toward zero and saturate, NaN becomes 0).
void store_from_float(void* data, DType dtype, size_t index, float value);

// Bulk conversions, used on hot paths (cache writes, test set-up).
void convert_to_float(const void* src, DType src_dtype, float* dst, size_t count);
void convert_from_float(const float* src, void* dst, DType dst_dtype, size_t count);

}  // namespace specula
