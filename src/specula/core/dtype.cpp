// Exact float32 <-> narrow-float conversions. One generic encoder handles every format by its
// exponent and mantissa widths; decoders of the 8-bit types are 256-entry tables.
#include "specula/core/dtype.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "specula/core/error.h"

namespace specula {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::fp8_e4m3: return 1;
    case DType::fp8_e5m2: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  SPECULA_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16 ||
         dtype == DType::fp8_e4m3 || dtype == DType::fp8_e5m2;
}

DType parse_dtype(std::string_view name) {
  struct Alias { std::string_view name; DType dtype; };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},           {"float32", DType::f32},       {"float", DType::f32},
      {"f16", DType::f16},           {"float16", DType::f16},       {"half", DType::f16},
      {"bf16", DType::bf16},         {"bfloat16", DType::bf16},     {"fp8_e4m3", DType::fp8_e4m3},
      {"fp8", DType::fp8_e4m3},      {"float8_e4m3fn", DType::fp8_e4m3},
      {"fp8_e5m2", DType::fp8_e5m2}, {"float8_e5m2", DType::fp8_e5m2},
      {"i32", DType::i32},           {"int32", DType::i32},         {"i64", DType::i64},
      {"int64", DType::i64},         {"u8", DType::u8},             {"uint8", DType::u8},
  };
  for (const auto& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  SPECULA_CHECK(false, "dtype '{}' is not known; known: f32, f16, bf16, fp8_e4m3, fp8_e5m2, i32, "
                "i64, u8 (aliases: float32, float16, bfloat16, fp8, float8_e4m3fn, float8_e5m2, "
                "int32, int64, uint8)", name);
  return DType::f32;
}

namespace {

// A binary floating-point format with kExp exponent bits and kMant explicit mantissa bits.
// kFiniteOnly marks the "fn" formats (e4m3fn): no infinities, only the all-ones pattern is NaN.
template <int kExp, int kMant, bool kFiniteOnly>
struct Format {
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  static constexpr int kMinExp = 1 - kBias;  // exponent of the smallest normal number
  static constexpr uint32_t kSignBit = 1u << (kExp + kMant);
  static constexpr uint32_t kInfCode = ((1u << kExp) - 1) << kMant;
  static constexpr uint32_t kNanCode = kFiniteOnly ? (kSignBit - 1) : (kInfCode | (1u << (kMant - 1)));
  // Largest finite magnitude's code: fn formats give up only the all-ones mantissa for NaN.
  static constexpr uint32_t kMaxFiniteCode = kFiniteOnly ? (kSignBit - 2) : (kInfCode - 1);

  static uint32_t encode(float value) {
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    const uint32_t sign = (bits >> 31) ? kSignBit : 0;
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return sign | kNanCode;
    if (magnitude == 0x7f800000u) return sign | (kFiniteOnly ? kNanCode : kInfCode);

    // value = significand * 2^(exponent - 23), significand < 2^24.
    int exponent = static_cast<int>(magnitude >> 23) - 127;
    uint32_t significand = magnitude & 0x7fffffu;
    if ((magnitude >> 23) != 0) {
      significand |= 0x800000u;
    } else {
      exponent = -126;  // float32 subnormal: no implicit bit
    }
    // Express the value in units of the target's quantum 2^(target_exp - kMant), where the
    // target exponent is clamped at the smallest normal one (that is what makes subnormals).
    const int target_exp = exponent > kMinExp ? exponent : kMinExp;
    const int shift = 23 + target_exp - kMant - exponent;  // >= 23 - kMant >= 0
    if (shift > 24) return sign;  // below half the smallest subnormal: rounds to zero
    uint32_t units = significand >> shift;
    const uint32_t remainder = significand & ((1u << shift) - 1);
    const uint32_t half = shift > 0 ? (1u << (shift - 1)) : 0;
    if (shift > 0 && (remainder > half || (remainder == half && (units & 1u)))) ++units;
    // With units in [0, 2^(kMant+1)], adding the exponent offset yields the code directly: a
    // subnormal that rounded up to 2^kMant becomes the smallest normal, and a mantissa that
    // overflowed to 2^(kMant+1) carries into the exponent field.
    const uint32_t code = units + (static_cast<uint32_t>(target_exp - kMinExp) << kMant);
    if (code > kMaxFiniteCode) return sign | (kFiniteOnly ? kNanCode : kInfCode);
    return sign | code;
  }

  static float decode(uint32_t code) {
    const bool negative = (code & kSignBit) != 0;
    const uint32_t magnitude = code & (kSignBit - 1);
    const uint32_t exp_field = magnitude >> kMant;
    const uint32_t mantissa = magnitude & ((1u << kMant) - 1);
    float result;
    if (kFiniteOnly ? magnitude == (kSignBit - 1) : exp_field == (1u << kExp) - 1) {
      result = (!kFiniteOnly && mantissa == 0) ? INFINITY : NAN;
    } else if (exp_field == 0) {
      result = std::ldexp(static_cast<float>(mantissa), kMinExp - kMant);
    } else {
      result = std::ldexp(static_cast<float>(mantissa | (1u << kMant)),
                          static_cast<int>(exp_field) - kBias - kMant);
    }
    return negative ? -result : result;
  }
};

using F16 = Format<5, 10, false>;
using E4M3 = Format<4, 3, true>;
using E5M2 = Format<5, 2, false>;

template <typename Fmt>
std::array<float, 256> make_table() {
  std::array<float, 256> table{};
  for (uint32_t code = 0; code < 256; ++code) table[code] = Fmt::decode(code);
  return table;
}

const std::array<float, 256>& e4m3_table() {
  static const auto table = make_table<E4M3>();
  return table;
}
const std::array<float, 256>& e5m2_table() {
  static const auto table = make_table<E5M2>();
  return table;
}

// float -> integer without undefined behaviour: NaN gives 0, out-of-range values saturate.
template <typename T>
T saturate(float value) {
  if (std::isnan(value)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  const double v = static_cast<double>(value);
  if (v <= lo) return std::numeric_limits<T>::min();
  if (v >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

}  // namespace

uint16_t float_to_f16_bits(float value) { return static_cast<uint16_t>(F16::encode(value)); }
uint16_t float_to_bf16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  // bf16 shares float32's exponent range, so rounding is a carry into the upper half.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
uint8_t float_to_fp8_e4m3_bits(float value) { return static_cast<uint8_t>(E4M3::encode(value)); }
uint8_t float_to_fp8_e5m2_bits(float value) { return static_cast<uint8_t>(E5M2::encode(value)); }

float f16_bits_to_float(uint16_t bits) { return F16::decode(bits); }
float fp8_e4m3_bits_to_float(uint8_t bits) { return e4m3_table()[bits]; }
float fp8_e5m2_bits_to_float(uint8_t bits) { return e5m2_table()[bits]; }

float load_as_float(const void* data, DType dtype, size_t index) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[index];
    case DType::f16: return f16_bits_to_float(static_cast<const uint16_t*>(data)[index]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(data)[index]);
    case DType::fp8_e4m3: return fp8_e4m3_bits_to_float(static_cast<const uint8_t*>(data)[index]);
    case DType::fp8_e5m2: return fp8_e5m2_bits_to_float(static_cast<const uint8_t*>(data)[index]);
    case DType::i32: return static_cast<float>(static_cast<const int32_t*>(data)[index]);
    case DType::i64: return static_cast<float>(static_cast<const int64_t*>(data)[index]);
    case DType::u8: return static_cast<float>(static_cast<const uint8_t*>(data)[index]);
  }
  return 0.0f;
}

void store_from_float(void* data, DType dtype, size_t index, float value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[index] = value; return;
    case DType::f16: static_cast<uint16_t*>(data)[index] = float_to_f16_bits(value); return;
    case DType::bf16: static_cast<uint16_t*>(data)[index] = float_to_bf16_bits(value); return;
    case DType::fp8_e4m3: static_cast<uint8_t*>(data)[index] = float_to_fp8_e4m3_bits(value); return;
    case DType::fp8_e5m2: static_cast<uint8_t*>(data)[index] = float_to_fp8_e5m2_bits(value); return;
    case DType::i32: static_cast<int32_t*>(data)[index] = saturate<int32_t>(value); return;
    case DType::i64: static_cast<int64_t*>(data)[index] = saturate<int64_t>(value); return;
    case DType::u8: static_cast<uint8_t*>(data)[index] = saturate<uint8_t>(value); return;
  }
}

void convert_to_float(const void* src, DType src_dtype, float* dst, size_t count) {
  switch (src_dtype) {
    case DType::f32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = bf16_bits_to_float(s[i]);
      return;
    }
    case DType::fp8_e4m3: {
      const auto& table = e4m3_table();
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = table[s[i]];
      return;
    }
    default:
      for (size_t i = 0; i < count; ++i) dst[i] = load_as_float(src, src_dtype, i);
  }
}

void convert_from_float(const float* src, void* dst, DType dst_dtype, size_t count) {
  for (size_t i = 0; i < count; ++i) store_from_float(dst, dst_dtype, i, src[i]);
}

}  // namespace specula
