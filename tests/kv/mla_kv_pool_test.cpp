// MLAKVPool and its host codecs: bf16 rows round-trip exactly to bf16 rounding; fp8_ds_mla rows
// have the documented byte layout (656 bytes at 512 + 64: fp8 values, f32 tile scales at 512,
// bf16 RoPE at 528), scales of max/448, errors within e4m3's half-ulp, saturation instead of NaN
// and a scale of 1 for all-zero tiles; indexer keys likewise; copy_slots moves every buffer's
// rows in order; bad input is a clear error. Fresh random inputs each run; a failure prints the
// seed, and SPECULA_TEST_SEED repeats it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/kv/mla_kv_pool.h"

namespace specula {
namespace {

uint32_t fresh_seed() {
  const char* env = std::getenv("SPECULA_TEST_SEED");
  return env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
}

#define SEED_TRACE(seed) SCOPED_TRACE(::testing::Message() << "seed " << (seed) << " (SPECULA_TEST_SEED=" << (seed) << " repeats it)")

// Random values whose magnitude varies per block of 128 (10^-3 .. 10^3), so that tiles differ in
// scale; never all zero.
std::vector<float> random_values(std::mt19937& rng, size_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<float> v(count);
  float magnitude = 1.0f;
  for (size_t i = 0; i < count; ++i) {
    if (i % kMlaFp8TileSize == 0) magnitude = std::pow(10.0f, exponent(rng));
    v[i] = normal(rng) * magnitude;
  }
  return v;
}

// A host tensor [rows, cols] of `dtype` holding `values` (rounded to nearest even).
Buffer make_tensor(const std::vector<float>& values, int64_t rows, int64_t cols, DType dtype) {
  Buffer b(dtype, {rows, cols});
  convert_from_float(values.data(), b.data(), dtype, values.size());
  return b;
}

// The values a tensor of `dtype` holds for `values`.
std::vector<float> as_stored(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> raw(values.size() * dtype_size(dtype));
  convert_from_float(values.data(), raw.data(), dtype, values.size());
  std::vector<float> out(values.size());
  convert_to_float(raw.data(), dtype, out.data(), out.size());
  return out;
}

float bf16_round(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

float read_f32(const uint8_t* p) {
  float v = 0.0f;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint16_t read_u16(const uint8_t* p) {
  uint16_t v = 0;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

float tile_max(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr float kE4m3HalfUlp = 0.0625f;  // 2^-4: half an ulp of a 3-bit mantissa, relative

TEST(MLAKVFormat, NamesParseAndRowSizes) {
  EXPECT_EQ(mla_kv_format_name(MlaKVFormat::bf16), "bf16");
  EXPECT_EQ(mla_kv_format_name(MlaKVFormat::fp8_ds_mla), "fp8_ds_mla");
  EXPECT_EQ(parse_mla_kv_format("bf16"), MlaKVFormat::bf16);
  EXPECT_EQ(parse_mla_kv_format("bfloat16"), MlaKVFormat::bf16);
  EXPECT_EQ(parse_mla_kv_format("fp8_ds_mla"), MlaKVFormat::fp8_ds_mla);
  EXPECT_EQ(parse_mla_kv_format("fp8"), MlaKVFormat::fp8_ds_mla);
  const std::string message = error_of([] { parse_mla_kv_format("fp16"); });
  EXPECT_NE(message.find("'fp16'"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16, fp8_ds_mla"), std::string::npos) << message;
  EXPECT_EQ(mla_row_bytes(MlaKVFormat::bf16, 512, 64), 1152);
  EXPECT_EQ(mla_row_bytes(MlaKVFormat::fp8_ds_mla, 512, 64), 656);
  EXPECT_EQ(mla_row_bytes(MlaKVFormat::fp8_ds_mla, 128, 32), 128 + 4 + 64);
  EXPECT_EQ(mla_index_row_bytes(128), 132);
  EXPECT_EQ(mla_index_row_bytes(0), 0);
}

TEST(MLAKVPool, Bf16RoundTripIsExactToBf16Rounding) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  constexpr int kRank = 512, kRope = 64;
  const std::vector<int32_t> loc{5, 31, 0, 17};
  const auto n = static_cast<int64_t>(loc.size());
  for (DType src : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(src));
    MLAKVPool pool(MLAKVPoolConfig{32, 2, kRank, kRope, MlaKVFormat::bf16, 0, Device::cpu()});
    EXPECT_EQ(pool.row_bytes(), 1152);
    EXPECT_EQ(pool.kv_buffer(1).shape(), (Shape{32, 1152}));
    EXPECT_EQ(pool.kv_buffer(1).dtype(), DType::u8);
    EXPECT_EQ(pool.bytes_per_token(), 2u * 1152u);
    // f16 keeps magnitudes below its 65504 limit.
    std::vector<float> c = random_values(rng, static_cast<size_t>(n * kRank));
    std::vector<float> pe = random_values(rng, static_cast<size_t>(n * kRope));
    if (src == DType::f16) {
      for (float& x : c) x = std::clamp(x, -60000.0f, 60000.0f);
    }
    pool.set_mla_kv_buffer(1, loc, make_tensor(c, n, kRank, src), make_tensor(pe, n, kRope, src));
    const std::vector<float> sc = as_stored(c, src), spe = as_stored(pe, src);
    std::vector<float> out(static_cast<size_t>(n * (kRank + kRope)));
    pool.read_rows(1, loc, out.data());
    for (int64_t t = 0; t < n; ++t) {
      for (int i = 0; i < kRank; ++i) {
        ASSERT_EQ(out[static_cast<size_t>(t * (kRank + kRope) + i)], bf16_round(sc[static_cast<size_t>(t * kRank + i)]))
            << "token " << t << " latent " << i;
      }
      for (int i = 0; i < kRope; ++i) {
        ASSERT_EQ(out[static_cast<size_t>(t * (kRank + kRope) + kRank + i)], bf16_round(spe[static_cast<size_t>(t * kRope + i)]))
            << "token " << t << " rope " << i;
      }
    }
    if (src == DType::bf16) {  // bf16 in, bf16 out: the bytes themselves
      const Buffer raw = make_tensor(c, n, kRank, DType::bf16);
      EXPECT_EQ(std::memcmp(pool.kv_buffer(1).data_as<uint8_t>() + 17 * 1152, raw.data_as<uint8_t>() + 3 * kRank * 2, kRank * 2), 0);
    }
    // Other slots and the other layer stay zero.
    const TensorView l0 = pool.kv_buffer(0), l1 = pool.kv_buffer(1);
    for (int64_t b = 0; b < l0.numel(); ++b) ASSERT_EQ(l0.data_as<uint8_t>()[b], 0) << "layer 0 byte " << b;
    for (int64_t b = 1152; b < 5 * 1152; ++b) ASSERT_EQ(l1.data_as<uint8_t>()[b], 0) << "layer 1 byte " << b;
  }
}

TEST(MLAKVPool, Fp8RowIs656BytesOfCodesScalesThenRope) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  constexpr int kRank = 512, kRope = 64;
  MLAKVPool pool(MLAKVPoolConfig{16, 1, kRank, kRope, MlaKVFormat::fp8_ds_mla, 0, Device::cpu()});
  ASSERT_EQ(pool.row_bytes(), 656);
  EXPECT_EQ(pool.kv_buffer(0).shape(), (Shape{16, 656}));
  EXPECT_EQ(pool.bytes_per_token(), 656u);
  for (DType src : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(src));
    const std::vector<int32_t> loc{9, 3};
    std::vector<float> c = random_values(rng, 2 * kRank);
    std::vector<float> pe = random_values(rng, 2 * kRope);
    if (src == DType::f16) {
      for (float& x : c) x = std::clamp(x, -60000.0f, 60000.0f);
    }
    pool.set_mla_kv_buffer(0, loc, make_tensor(c, 2, kRank, src), make_tensor(pe, 2, kRope, src));
    const std::vector<float> sc = as_stored(c, src), spe = as_stored(pe, src);
    for (int t = 0; t < 2; ++t) {
      const uint8_t* row = pool.kv_buffer(0).data_as<uint8_t>() + loc[static_cast<size_t>(t)] * 656;
      const float* x = sc.data() + t * kRank;
      for (int tile = 0; tile < kRank / 128; ++tile) {
        const float scale = read_f32(row + 512 + 4 * tile);
        ASSERT_EQ(scale, tile_max(x + tile * 128, 128) / 448.0f) << "token " << t << " tile " << tile;
        for (int i = tile * 128; i < (tile + 1) * 128; ++i) {
          ASSERT_EQ(row[i], float_to_fp8_e4m3_bits(std::clamp(x[i] / scale, -448.0f, 448.0f))) << "token " << t << " value " << i;
        }
      }
      for (int i = 0; i < kRope; ++i) {
        ASSERT_EQ(read_u16(row + 528 + 2 * i), float_to_bf16_bits(spe[static_cast<size_t>(t * kRope + i)])) << "rope " << i;
      }
      // The pool writes exactly what the shared encoder writes.
      std::vector<uint8_t> encoded(656);
      encode_mla_row(MlaKVFormat::fp8_ds_mla, x, spe.data() + t * kRope, kRank, kRope, encoded.data());
      EXPECT_EQ(std::memcmp(encoded.data(), row, 656), 0);
    }
  }
}

TEST(MLAKVPool, Fp8ScalePerTileIsTileMaxOver448) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  constexpr int kRank = 256, kRope = 32;  // two tiles per row; a smaller, legal layout
  const std::vector<float> c = random_values(rng, 7 * kRank);
  const std::vector<float> pe = random_values(rng, 7 * kRope);
  for (int t = 0; t < 7; ++t) {
    std::vector<uint8_t> row(static_cast<size_t>(mla_row_bytes(MlaKVFormat::fp8_ds_mla, kRank, kRope)));
    ASSERT_EQ(row.size(), 256u + 8u + 64u);
    encode_mla_row(MlaKVFormat::fp8_ds_mla, c.data() + t * kRank, pe.data() + t * kRope, kRank, kRope, row.data());
    for (int tile = 0; tile < 2; ++tile) {
      const float* x = c.data() + t * kRank + tile * 128;
      const float amax = tile_max(x, 128);
      ASSERT_EQ(read_f32(row.data() + 256 + 4 * tile), amax / 448.0f);
      // The largest magnitude lands on (or rounds to) e4m3's largest code, 448 = 0x7e.
      const int at = static_cast<int>(std::find_if(x, x + 128, [&](float v) { return std::fabs(v) == amax; }) - x);
      EXPECT_EQ(row[static_cast<size_t>(tile * 128 + at)] & 0x7f, 0x7e) << "token " << t << " tile " << tile;
    }
  }
}

TEST(MLAKVPool, Fp8DequantisationIsWithinTheE4m3Bound) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  constexpr int kRank = 512, kRope = 64, kTokens = 24;
  MLAKVPool pool(MLAKVPoolConfig{64, 1, kRank, kRope, MlaKVFormat::fp8_ds_mla, 0, Device::cpu()});
  std::vector<int32_t> loc(kTokens);
  for (int t = 0; t < kTokens; ++t) loc[static_cast<size_t>(t)] = 63 - 2 * t;
  const std::vector<float> c = random_values(rng, kTokens * kRank);
  const std::vector<float> pe = random_values(rng, kTokens * kRope);
  pool.set_mla_kv_buffer(0, loc, make_tensor(c, kTokens, kRank, DType::f32), make_tensor(pe, kTokens, kRope, DType::f32));
  std::vector<float> out(kTokens * (kRank + kRope));
  pool.read_rows(0, loc, out.data());
  float worst = 0.0f;  // the largest error seen, relative to its tile max
  for (int t = 0; t < kTokens; ++t) {
    for (int tile = 0; tile < kRank / 128; ++tile) {
      const float* x = c.data() + t * kRank + tile * 128;
      const float amax = tile_max(x, 128);
      const float scale = amax / 448.0f;
      for (int i = 0; i < 128; ++i) {
        const float got = out[static_cast<size_t>(t * (kRank + kRope) + tile * 128 + i)];
        const float err = std::fabs(got - x[i]);
        // Relative to the tile max (the rule), and per value: half an ulp of a normal e4m3 value
        // is at most 2^-4 of it; e4m3 subnormals are 2^-9 apart, in units of the scale. The
        // 1e-6 covers the two f32 roundings (x / scale, code * scale).
        ASSERT_LE(err, kE4m3HalfUlp * amax * (1.0f + 1e-6f)) << "token " << t << " tile " << tile << " value " << i;
        ASSERT_LE(err, (kE4m3HalfUlp * std::fabs(x[i]) + std::ldexp(scale, -10)) * (1.0f + 1e-6f)) << "value " << x[i];
        worst = std::max(worst, err / amax);
      }
    }
    for (int i = 0; i < kRope; ++i) {
      ASSERT_EQ(out[static_cast<size_t>(t * (kRank + kRope) + kRank + i)], bf16_round(pe[static_cast<size_t>(t * kRope + i)]));
    }
  }
  EXPECT_GT(worst, 0.0f);  // the fp8 path did round something
}

TEST(MLAKVPool, Fp8OutliersSaturateAndNeverGiveNaN) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  constexpr int kRank = 512, kRope = 64;
  const float denorm = std::numeric_limits<float>::denorm_min();
  std::vector<float> c = random_values(rng, kRank);
  const std::vector<float> pe = random_values(rng, kRope);
  c[3] = 1e30f;                                            // tile 0: one huge outlier
  c[128 + 5] = std::numeric_limits<float>::max();          // tile 1: the largest floats
  c[128 + 6] = -std::numeric_limits<float>::max();
  // Tile 2: a subnormal max, 627 * denorm_min. max / 448 rounds down to one denorm_min, so
  // x / scale reaches 627, beyond e4m3's 448 (unsaturated it would encode as NaN).
  for (int i = 256; i < 384; ++i) c[static_cast<size_t>(i)] = static_cast<float>(i % 7 - 3) * 100.0f * denorm;
  c[300] = -627.0f * denorm;
  // Tile 3: so small a max that max / 448 underflows to zero: the scale falls back to 1
  // rather than computing 0 / 0.
  for (int i = 384; i < 512; ++i) c[static_cast<size_t>(i)] = static_cast<float>(i % 5 - 2) * 50.0f * denorm;
  std::vector<uint8_t> row(656);
  encode_mla_row(MlaKVFormat::fp8_ds_mla, c.data(), pe.data(), kRank, kRope, row.data());
  for (int i = 0; i < kRank; ++i) ASSERT_NE(row[static_cast<size_t>(i)] & 0x7f, 0x7f) << "NaN code at " << i;
  EXPECT_EQ(row[300], 0xfe);  // saturated to -448
  EXPECT_EQ(read_f32(row.data() + 512 + 8), denorm);
  EXPECT_EQ(read_f32(row.data() + 512 + 12), 1.0f);
  std::vector<float> out(kRank + kRope);
  decode_mla_row(MlaKVFormat::fp8_ds_mla, row.data(), kRank, kRope, out.data());
  for (int i = 0; i < kRank + kRope; ++i) ASSERT_TRUE(std::isfinite(out[static_cast<size_t>(i)])) << "value " << i;
  // The outliers themselves come back within the e4m3 bound of their tile's max.
  EXPECT_NEAR(out[3], 1e30f, kE4m3HalfUlp * 1e30f);
  EXPECT_NEAR(out[128 + 5], std::numeric_limits<float>::max(), kE4m3HalfUlp * std::numeric_limits<float>::max());
  EXPECT_EQ(out[128 + 6], -out[128 + 5]);
  // The same through the pool with an f16 source at its own limit.
  MLAKVPool pool(MLAKVPoolConfig{4, 1, kRank, kRope, MlaKVFormat::fp8_ds_mla, 0, Device::cpu()});
  std::vector<float> h = random_values(rng, kRank);
  for (float& x : h) x = std::clamp(x, -1000.0f, 1000.0f);
  h[17] = 65504.0f;
  pool.set_mla_kv_buffer(0, std::vector<int32_t>{2}, make_tensor(h, 1, kRank, DType::f16), make_tensor(pe, 1, kRope, DType::f16));
  pool.read_rows(0, std::vector<int32_t>{2}, out.data());
  for (int i = 0; i < kRank + kRope; ++i) ASSERT_TRUE(std::isfinite(out[static_cast<size_t>(i)])) << "value " << i;
  EXPECT_NEAR(out[17], 65504.0f, kE4m3HalfUlp * 65504.0f);
}

TEST(MLAKVPool, Fp8ZeroTileStoresZerosWithScaleOne) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  constexpr int kRank = 512, kRope = 64;
  std::vector<float> c = random_values(rng, kRank);
  const std::vector<float> pe = random_values(rng, kRope);
  std::fill(c.begin() + 128, c.begin() + 256, 0.0f);   // tile 1: +0 only
  std::fill(c.begin() + 384, c.begin() + 512, -0.0f);  // tile 3: -0 only
  std::vector<uint8_t> row(656);
  encode_mla_row(MlaKVFormat::fp8_ds_mla, c.data(), pe.data(), kRank, kRope, row.data());
  EXPECT_EQ(read_f32(row.data() + 512 + 4), 1.0f);
  EXPECT_EQ(read_f32(row.data() + 512 + 12), 1.0f);
  for (int i = 128; i < 256; ++i) ASSERT_EQ(row[static_cast<size_t>(i)], 0) << i;
  for (int i = 384; i < 512; ++i) ASSERT_EQ(row[static_cast<size_t>(i)], 0x80) << i;  // e4m3 -0
  EXPECT_EQ(read_f32(row.data() + 512), tile_max(c.data(), 128) / 448.0f);  // neighbours unaffected
  std::vector<float> out(kRank + kRope);
  decode_mla_row(MlaKVFormat::fp8_ds_mla, row.data(), kRank, kRope, out.data());
  for (int i = 128; i < 256; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], 0.0f) << i;
  for (int i = 384; i < 512; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], 0.0f) << i;
  // A never-written slot (zero codes, zero scales) reads as zeros, not NaN.
  MLAKVPool pool(MLAKVPoolConfig{4, 1, kRank, kRope, MlaKVFormat::fp8_ds_mla, 128, Device::cpu()});
  pool.read_rows(0, std::vector<int32_t>{3}, out.data());
  for (float v : out) ASSERT_EQ(v, 0.0f);
  std::vector<float> key(128);
  pool.read_index_rows(0, std::vector<int32_t>{3}, key.data());
  for (float v : key) ASSERT_EQ(v, 0.0f);
}

TEST(MLAKVPool, IndexKeysAreFp8ThenOneScale) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  for (MlaKVFormat format : {MlaKVFormat::bf16, MlaKVFormat::fp8_ds_mla}) {
    for (int d : {16, 128}) {
      for (DType src : {DType::f32, DType::bf16, DType::f16}) {
        SCOPED_TRACE(::testing::Message() << mla_kv_format_name(format) << " index_head_dim " << d << " " << dtype_name(src));
        MLAKVPool pool(MLAKVPoolConfig{20, 2, 512, 64, format, d, Device::cpu()});
        ASSERT_EQ(pool.index_row_bytes(), d + 4);
        EXPECT_EQ(pool.index_buffer(1).shape(), (Shape{20, d + 4}));
        EXPECT_EQ(pool.bytes_per_token(), 2u * static_cast<size_t>(pool.row_bytes() + d + 4));
        const std::vector<int32_t> loc{19, 4, 11};
        std::vector<float> k = random_values(rng, static_cast<size_t>(3 * d));
        for (float& x : k) x = std::clamp(x, -60000.0f, 60000.0f);
        std::fill(k.begin() + d, k.begin() + 2 * d, 0.0f);  // the second key is all zero
        pool.set_index_k(1, loc, make_tensor(k, 3, d, src));
        const std::vector<float> sk = as_stored(k, src);
        std::vector<float> out(static_cast<size_t>(3 * d));
        pool.read_index_rows(1, loc, out.data());
        for (int t = 0; t < 3; ++t) {
          const uint8_t* row = pool.index_buffer(1).data_as<uint8_t>() + loc[static_cast<size_t>(t)] * (d + 4);
          const float* x = sk.data() + t * d;
          const float amax = tile_max(x, d);
          const float scale = read_f32(row + d);
          ASSERT_EQ(scale, t == 1 ? 1.0f : amax / 448.0f);
          for (int i = 0; i < d; ++i) {
            ASSERT_EQ(row[i], float_to_fp8_e4m3_bits(std::clamp(x[i] / scale, -448.0f, 448.0f))) << "key " << t << " value " << i;
            const float err = std::fabs(out[static_cast<size_t>(t * d + i)] - x[i]);
            ASSERT_LE(err, kE4m3HalfUlp * amax * (1.0f + 1e-6f)) << "key " << t << " value " << i;
          }
          std::vector<uint8_t> encoded(static_cast<size_t>(d + 4));
          encode_index_row(x, d, encoded.data());
          EXPECT_EQ(std::memcmp(encoded.data(), row, encoded.size()), 0);
        }
        // The latent buffers are untouched by index writes.
        for (int64_t b = 0; b < pool.kv_buffer(1).numel(); ++b) ASSERT_EQ(pool.kv_buffer(1).data_as<uint8_t>()[b], 0);
      }
    }
  }
}

TEST(MLAKVPool, CopySlotsMovesLatentAndIndexRowsInOrder) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(1, 255);
  MLAKVPool pool(MLAKVPoolConfig{16, 3, 512, 64, MlaKVFormat::fp8_ds_mla, 64, Device::cpu()});
  std::vector<TensorView> buffers;
  for (int l = 0; l < 3; ++l) {
    buffers.push_back(pool.kv_buffer(l));
    buffers.push_back(pool.index_buffer(l));
  }
  for (const TensorView& b : buffers) {
    for (int64_t i = 0; i < b.numel(); ++i) b.data_as<uint8_t>()[i] = static_cast<uint8_t>(byte(rng));
  }
  auto row = [](const TensorView& b, int slot) {
    const int64_t bytes = b.size(1);
    return std::vector<uint8_t>(b.data_as<uint8_t>() + slot * bytes, b.data_as<uint8_t>() + (slot + 1) * bytes);
  };
  std::vector<std::vector<std::vector<uint8_t>>> before(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) {
    for (int s = 0; s < 16; ++s) before[b].push_back(row(buffers[b], s));
  }
  // An accepted path at tree positions 2 and 5 moves to 1 and 2: the second move writes the row
  // the first one reads, so order matters.
  const std::vector<int32_t> src{2, 5, 7}, dst{1, 2, 7};
  pool.copy_slots(src, dst);
  for (size_t b = 0; b < buffers.size(); ++b) {
    SCOPED_TRACE(::testing::Message() << "buffer " << b);
    EXPECT_EQ(row(buffers[b], 1), before[b][2]);
    EXPECT_EQ(row(buffers[b], 2), before[b][5]);
    for (int s : {0, 3, 4, 5, 6, 7, 8, 15}) EXPECT_EQ(row(buffers[b], s), before[b][static_cast<size_t>(s)]) << "slot " << s;
  }
  pool.copy_slots({}, {});
  EXPECT_NE(error_of([&] { pool.copy_slots(std::vector<int32_t>{16}, std::vector<int32_t>{0}); }).find("16"), std::string::npos);
  EXPECT_NE(error_of([&] { pool.copy_slots(src, std::vector<int32_t>{1}); }).find("3 sources but 1 destinations"), std::string::npos);
}

TEST(MLAKVPool, BadInputIsClear) {
  const uint32_t seed = fresh_seed();
  SEED_TRACE(seed);
  std::mt19937 rng(seed);
  auto expect_error = [](const auto& fn, std::initializer_list<std::string_view> parts) {
    const std::string message = error_of(fn);
    for (std::string_view part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  };
  auto config = [](MlaKVFormat format, int rank, int rope, int index) {
    return MLAKVPoolConfig{16, 2, rank, rope, format, index, Device::cpu()};
  };
  // Configurations.
  expect_error([&] { MLAKVPool p(config(MlaKVFormat::fp8_ds_mla, 500, 64, 0)); }, {"kv_lora_rank a multiple of 128", "500"});
  expect_error([&] { MLAKVPool p(config(MlaKVFormat::fp8_ds_mla, 512, 63, 0)); }, {"even qk_rope_head_dim", "63"});
  expect_error([&] { MLAKVPool p(config(MlaKVFormat::bf16, 512, 0, 0)); }, {"qk_rope_head_dim 0"});
  expect_error([&] { MLAKVPool p(config(MlaKVFormat::bf16, -1, 64, 0)); }, {"kv_lora_rank -1"});
  expect_error([&] { MLAKVPool p(config(MlaKVFormat::bf16, 512, 64, 100)); }, {"index_head_dim 100", "multiple of 16"});
  expect_error([&] { MLAKVPool p(config(MlaKVFormat::bf16, 512, 64, -16)); }, {"index_head_dim -16"});
  expect_error([&] { MLAKVPool p(MLAKVPoolConfig{0, 2, 512, 64, MlaKVFormat::bf16, 0, Device::cpu()}); }, {"num_slots 0"});
  expect_error([&] { MLAKVPool p(MLAKVPoolConfig{16, 0, 512, 64, MlaKVFormat::bf16, 0, Device::cpu()}); }, {"num_layers 0"});
  expect_error([&] { MLAKVPool p(config(static_cast<MlaKVFormat>(7), 512, 64, 0)); }, {"format code 7"});
  expect_error([&] { parse_mla_kv_format("e5m2"); }, {"'e5m2'", "fp8_ds_mla"});

  MLAKVPool pool(config(MlaKVFormat::fp8_ds_mla, 512, 64, 0));
  const std::vector<float> c = random_values(rng, 2 * 512), pe = random_values(rng, 2 * 64);
  const Buffer kv_c = make_tensor(c, 2, 512, DType::f32), k_pe = make_tensor(pe, 2, 64, DType::f32);
  const std::vector<int32_t> loc{1, 2};
  // Layer ids.
  expect_error([&] { pool.set_mla_kv_buffer(2, loc, kv_c, k_pe); }, {"layer_id 2", "[0, 2)"});
  expect_error([&] { pool.kv_buffer(-1); }, {"layer_id -1"});
  expect_error([&] { std::vector<float> out(576); pool.read_rows(5, std::vector<int32_t>{0}, out.data()); }, {"layer_id 5"});
  // Slots.
  expect_error([&] { pool.set_mla_kv_buffer(0, std::vector<int32_t>{1, 16}, kv_c, k_pe); }, {"slot 16 (token 1)", "[0, 16)"});
  expect_error([&] { pool.set_mla_kv_buffer(0, std::vector<int32_t>{-1, 0}, kv_c, k_pe); }, {"slot -1 (token 0)"});
  expect_error([&] { std::vector<float> out(576); pool.read_rows(0, std::vector<int32_t>{99}, out.data()); }, {"slot 99"});
  // Shapes and dtypes.
  expect_error([&] { pool.set_mla_kv_buffer(0, std::vector<int32_t>{1}, kv_c, k_pe); }, {"kv_c has shape [2, 512]; expected [1, 512]"});
  const Buffer narrow = make_tensor(random_values(rng, 2 * 32), 2, 32, DType::f32);
  expect_error([&] { pool.set_mla_kv_buffer(0, loc, kv_c, narrow); }, {"k_pe has shape [2, 32]; expected [2, 64]"});
  Buffer ints(DType::i32, {2, 512});
  expect_error([&] { pool.set_mla_kv_buffer(0, loc, ints, k_pe); }, {"dtype i32", "f32, bf16, f16"});
  const TensorView strided(kv_c.data(), DType::f32, Shape{2, 256}, Shape{512, 2}, Device::cpu());
  MLAKVPool small(config(MlaKVFormat::bf16, 256, 64, 0));
  expect_error([&] { small.set_mla_kv_buffer(0, loc, strided, k_pe); }, {"contiguous rows"});
  // The device overload on a host pool, and index keys on a pool without them.
  const TensorView loc_view(const_cast<int32_t*>(loc.data()), DType::i32, Shape{2});
  expect_error([&] { pool.set_mla_kv_buffer(0, loc_view, kv_c, k_pe, nullptr); }, {"for CUDA pools", "cpu"});
  expect_error([&] { pool.set_index_k(0, loc, kv_c); }, {"index_head_dim 0"});
  expect_error([&] { pool.index_buffer(0); }, {"index_head_dim 0"});
  MLAKVPool indexed(config(MlaKVFormat::bf16, 512, 64, 64));
  expect_error([&] { indexed.set_index_k(0, loc, kv_c); }, {"set_index_k k has shape [2, 512]; expected [2, 64]"});
  expect_error([&] { indexed.set_index_k(3, loc, kv_c); }, {"layer_id 3"});
  // Codecs refuse layouts the pool refuses.
  std::vector<uint8_t> row(1024);
  expect_error([&] { encode_mla_row(MlaKVFormat::fp8_ds_mla, c.data(), pe.data(), 100, 64, row.data()); }, {"100"});
  expect_error([&] { encode_index_row(c.data(), 0, row.data()); }, {"index_head_dim 0"});
}

}  // namespace
}  // namespace specula
