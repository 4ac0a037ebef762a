// DType conversions, checked exhaustively for the 8- and 16-bit formats against independent
// references: a brute-force nearest-value search (ties to even) over every code of the format,
// and the compiler's own _Float16 for f16.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "specula/core/dtype.h"
#include "specula/core/error.h"

namespace specula {
namespace {

struct FormatUnderTest {
  const char* name;
  int bits;
  int mantissa_bits;
  bool finite_only;  // e4m3fn: overflow gives NaN, no infinities
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);
};

// An independent decoder: sign * 2^(e - bias) * (1 + m / 2^M), from the field layout alone.
double decode_by_formula(uint32_t code, int bits, int mant, bool finite_only) {
  const int exp_bits = bits - 1 - mant;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = (code >> (bits - 1)) & 1u;
  const uint32_t e = (code >> mant) & ((1u << exp_bits) - 1);
  const uint32_t m = code & ((1u << mant) - 1);
  double v;
  if (!finite_only && e == (1u << exp_bits) - 1) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (finite_only && e == (1u << exp_bits) - 1 && m == (1u << mant) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::pow(2.0, 1 - bias) * (static_cast<double>(m) / std::pow(2.0, mant));
  } else {
    v = std::pow(2.0, static_cast<int>(e) - bias) * (1.0 + static_cast<double>(m) / std::pow(2.0, mant));
  }
  return neg ? -v : v;
}

// Brute-force round-to-nearest-even over the non-negative finite codes of a format.
class BruteForceEncoder {
 public:
  explicit BruteForceEncoder(const FormatUnderTest& f) : f_(f) {
    const uint32_t half = 1u << (f.bits - 1);
    for (uint32_t c = 0; c < half; ++c) {
      const double v = decode_by_formula(c, f.bits, f.mantissa_bits, f.finite_only);
      if (std::isfinite(v)) values_.push_back({v, c});
    }
    std::sort(values_.begin(), values_.end());
    // The value one step above the largest finite one, for rounding at the top of the range.
    const double max = values_.back().first;
    const double step = max - values_[values_.size() - 2].first;
    beyond_max_ = max + step;
  }

  // Returns the expected code; `overflow` marks results that are inf (IEEE) or NaN (fn).
  uint32_t encode(float x, bool& is_nan) const {
    is_nan = std::isnan(x);
    if (is_nan) return 0;
    const uint32_t sign = std::signbit(x) ? (1u << (f_.bits - 1)) : 0u;
    const double a = std::fabs(static_cast<double>(x));
    const uint32_t inf_code = ((1u << (f_.bits - 1 - f_.mantissa_bits)) - 1) << f_.mantissa_bits;
    auto overflow = [&]() -> uint32_t {
      if (f_.finite_only) {
        is_nan = true;
        return 0;
      }
      return sign | inf_code;
    };
    if (std::isinf(a)) return overflow();
    auto it = std::lower_bound(values_.begin(), values_.end(), std::make_pair(a, 0u));
    if (it != values_.end() && it->first == a) return sign | it->second;
    if (it == values_.end()) {
      // Above the largest finite value: compare with the virtual next value (odd mantissa for
      // the max, so an exact tie goes to the virtual value in IEEE formats).
      const auto& max = values_.back();
      const double d_max = a - max.first, d_next = beyond_max_ - a;
      const bool max_is_even = (max.second & 1u) == 0;
      if (d_max < d_next || (d_max == d_next && max_is_even)) return sign | max.second;
      return overflow();
    }
    const auto& hi = *it;
    const auto& lo = *(it - 1);
    const double d_lo = a - lo.first, d_hi = hi.first - a;
    if (d_lo < d_hi) return sign | lo.second;
    if (d_hi < d_lo) return sign | hi.second;
    return sign | ((lo.second & 1u) == 0 ? lo.second : hi.second);
  }

  const std::vector<std::pair<double, uint32_t>>& values() const { return values_; }

 private:
  FormatUnderTest f_;
  std::vector<std::pair<double, uint32_t>> values_;
  double beyond_max_ = 0;
};

const FormatUnderTest kFormats[] = {
    {"f16", 16, 10, false, [](float x) -> uint32_t { return float_to_f16_bits(x); },
     [](uint32_t c) { return f16_bits_to_float(static_cast<uint16_t>(c)); }},
    {"bf16", 16, 7, false, [](float x) -> uint32_t { return float_to_bf16_bits(x); },
     [](uint32_t c) { return bf16_bits_to_float(static_cast<uint16_t>(c)); }},
    {"fp8_e4m3", 8, 3, true, [](float x) -> uint32_t { return float_to_fp8_e4m3_bits(x); },
     [](uint32_t c) { return fp8_e4m3_bits_to_float(static_cast<uint8_t>(c)); }},
    {"fp8_e5m2", 8, 2, false, [](float x) -> uint32_t { return float_to_fp8_e5m2_bits(x); },
     [](uint32_t c) { return fp8_e5m2_bits_to_float(static_cast<uint8_t>(c)); }},
};

class DTypeConversion : public ::testing::TestWithParam<FormatUnderTest> {};

void expect_encodes_like_reference(const FormatUnderTest& f, const BruteForceEncoder& ref, float x) {
  bool expect_nan = false;
  const uint32_t expected = ref.encode(x, expect_nan);
  const uint32_t got = f.encode(x);
  if (expect_nan) {
    ASSERT_TRUE(std::isnan(f.decode(got))) << f.name << " x=" << x << " gave code " << got;
  } else {
    ASSERT_EQ(got, expected) << f.name << " x=" << std::hexfloat << x;
  }
}

TEST_P(DTypeConversion, DecodeEveryCodeMatchesFieldFormula) {
  const FormatUnderTest f = GetParam();
  for (uint32_t c = 0; c < (1u << f.bits); ++c) {
    const double expected = decode_by_formula(c, f.bits, f.mantissa_bits, f.finite_only);
    const float got = f.decode(c);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << f.name << " code " << c;
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << f.name << " code " << c;
      ASSERT_EQ(std::signbit(got), std::signbit(expected)) << f.name << " code " << c;
    }
  }
}

TEST_P(DTypeConversion, RoundTripEveryCode) {
  const FormatUnderTest f = GetParam();
  for (uint32_t c = 0; c < (1u << f.bits); ++c) {
    const float v = f.decode(c);
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(f.decode(f.encode(v)))) << f.name << " code " << c;
    } else {
      ASSERT_EQ(f.encode(v), c) << f.name << " code " << c;
    }
  }
}

// Every rounding boundary of the format: each midpoint between neighbours (an exact tie), and
// the floats just below and above it.
TEST_P(DTypeConversion, EveryMidpointRoundsToNearestEven) {
  const FormatUnderTest f = GetParam();
  const BruteForceEncoder ref(f);
  const auto& values = ref.values();
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float mid = static_cast<float>((values[i].first + values[i + 1].first) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      expect_encodes_like_reference(f, ref, x);
      expect_encodes_like_reference(f, ref, -x);
    }
  }
}

TEST_P(DTypeConversion, RandomFloatsAndSpecialValues) {
  const FormatUnderTest f = GetParam();
  const BruteForceEncoder ref(f);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) expect_encodes_like_reference(f, ref, std::bit_cast<float>(bits(rng)));
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                            448.0f, 464.0f, 464.1f, 480.0f, 57344.0f, 61440.0f, 65504.0f, 65520.0f, 1e-8f, 3e38f};
  for (float x : specials) {
    expect_encodes_like_reference(f, ref, x);
    expect_encodes_like_reference(f, ref, -x);
  }
}

INSTANTIATE_TEST_SUITE_P(AllNarrowFormats, DTypeConversion, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(info.param.name); });

// f16 against the compiler's own conversion, over every f16 boundary and random floats.
TEST(DTypeF16, MatchesCompilerFloat16) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1000000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_f16_bits(x), std::bit_cast<uint16_t>(static_cast<_Float16>(x))) << std::hexfloat << x;
  }
  for (uint32_t c = 0; c < 65536; ++c) {
    const float v = f16_bits_to_float(static_cast<uint16_t>(c));
    if (std::isnan(v)) continue;
    ASSERT_EQ(v, static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(c))));
  }
}

TEST(DTypeE4m3, OverflowIsNanAndMaxIs448) {
  EXPECT_EQ(fp8_e4m3_bits_to_float(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_float(0x7f)));
  EXPECT_EQ(float_to_fp8_e4m3_bits(464.0f), 0x7e);  // tie goes to the even mantissa (448)
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_float(float_to_fp8_e4m3_bits(470.0f))));
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_float(float_to_fp8_e4m3_bits(INFINITY))));
  EXPECT_EQ(fp8_e4m3_bits_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(DTypeNames, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::fp8_e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::fp8_e4m3);
  try {
    parse_dtype("fp4");
    FAIL() << "fp4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp4'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(DTypeBulk, ConvertRoundTripsThroughEveryFloatType) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> src(1000);
  for (float& x : src) x = dist(rng);
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    std::vector<uint8_t> raw(src.size() * dtype_size(d));
    convert_from_float(src.data(), raw.data(), d, src.size());
    std::vector<float> back(src.size());
    convert_to_float(raw.data(), d, back.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      ASSERT_EQ(back[i], load_as_float(raw.data(), d, i));
      store_from_float(raw.data(), d, i, src[i]);
      ASSERT_EQ(back[i], load_as_float(raw.data(), d, i));
      const float rel = d == DType::f32 ? 0 : d == DType::f16 ? 1e-3f : d == DType::bf16 ? 8e-3f : 0.13f;
      ASSERT_LE(std::fabs(back[i] - src[i]), rel * std::fabs(src[i]) + 2e-3f) << dtype_name(d) << " " << src[i];
    }
  }
}

}  // namespace
}  // namespace specula
