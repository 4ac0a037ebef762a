// MHAKVPool: set_kv_buffer stores exactly the rounded values at the right slots, fp8 applies the
// per-layer scale with saturation, and bad input is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"

namespace specula {
namespace {

TEST(MHAKVPool, WritesRoundedValuesAtSlots) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3}) {
    MHAKVPool pool(KVPoolConfig{64, 2, 2, 8, 16, dtype, Device::cpu()});
    pool.set_kv_scales(1, 0.3f, 0.07f);
    const std::vector<int32_t> loc{5, 63, 17};
    Buffer k(DType::f32, {3, 2, 8});
    Buffer v(DType::f32, {3, 2, 16});
    for (int i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = dist(rng);
    for (int i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = dist(rng);
    k.data_as<float>()[0] = 1000.0f;  // fp8: saturates to 448 * scale, never NaN
    pool.set_kv_buffer(1, loc, k, v);
    const bool fp8 = dtype == DType::fp8_e4m3;
    const float ks = fp8 ? 0.3f : 1.0f, vs = fp8 ? 0.07f : 1.0f;
    for (size_t t = 0; t < loc.size(); ++t) {
      for (int e = 0; e < 16; ++e) {
        const float kin = k.data_as<float>()[t * 16 + static_cast<size_t>(e)];
        const float kq = fp8 ? std::clamp(kin / ks, -448.0f, 448.0f) : kin;
        uint8_t raw[4];
        store_from_float(raw, dtype, 0, kq);
        const float stored_k = load_as_float(pool.k_buffer(1).data(), dtype, static_cast<size_t>(loc[t]) * 16 + static_cast<size_t>(e));
        ASSERT_EQ(stored_k, load_as_float(raw, dtype, 0)) << dtype_name(dtype);
      }
      for (int e = 0; e < 32; ++e) {
        const float vin = fp8 ? std::clamp(v.data_as<float>()[t * 32 + static_cast<size_t>(e)] / vs, -448.0f, 448.0f)
                              : v.data_as<float>()[t * 32 + static_cast<size_t>(e)];
        uint8_t raw[4];
        store_from_float(raw, dtype, 0, vin);
        const float stored = load_as_float(pool.v_buffer(1).data(), dtype, static_cast<size_t>(loc[t]) * 32 + static_cast<size_t>(e));
        ASSERT_EQ(stored, load_as_float(raw, dtype, 0));
      }
    }
    // Layer 0 untouched.
    for (int64_t i = 0; i < pool.k_buffer(0).numel(); ++i) ASSERT_EQ(load_as_float(pool.k_buffer(0).data(), dtype, static_cast<size_t>(i)), 0.0f);
  }
}

TEST(MHAKVPool, BadInputIsClear) {
  MHAKVPool pool(KVPoolConfig{16, 1, 2, 8, 8, DType::bf16, Device::cpu()});
  Buffer k(DType::f32, {1, 2, 8});
  Buffer v(DType::f32, {1, 2, 8});
  auto message = [&](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([&] { pool.set_kv_buffer(0, std::vector<int32_t>{16}, k, v); }).find("cache location 16"), std::string::npos);
  EXPECT_NE(message([&] { pool.set_kv_buffer(1, std::vector<int32_t>{3}, k, v); }).find("layer_id 1"), std::string::npos);
  EXPECT_NE(message([&] { pool.set_kv_buffer(0, std::vector<int32_t>{1, 2}, k, v); }).find("shape"), std::string::npos);
  EXPECT_NE(message([] { MHAKVPool p(KVPoolConfig{16, 1, 2, 8, 8, DType::i32, Device::cpu()}); }).find("i32"), std::string::npos);
  EXPECT_THROW(pool.set_kv_scales(0, 0.0f, 1.0f), Error);
}

}  // namespace
}  // namespace specula
