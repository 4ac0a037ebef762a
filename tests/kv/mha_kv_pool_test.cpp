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

namespace specula {
namespace {

TEST(MHAKVPoolCopySlots, MovesRowsInOrderAcrossEveryLayer) {
  MHAKVPool pool(KVPoolConfig{16, 3, 2, 8, 8, DType::f32, Device::cpu()});
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int l = 0; l < 3; ++l) {
    for (const TensorView& t : {pool.k_buffer(l), pool.v_buffer(l)}) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = value(rng);
    }
  }
  auto row = [&](const TensorView& t, int slot) {
    return std::vector<float>(t.data_as<float>() + slot * 16, t.data_as<float>() + (slot + 1) * 16);
  };
  std::vector<std::vector<float>> before_k, before_v;
  for (int s = 0; s < 16; ++s) {
    before_k.push_back(row(pool.k_buffer(2), s));
    before_v.push_back(row(pool.v_buffer(0), s));
  }
  // An accepted path at tree positions 2 and 5 moves to positions 1 and 2: the second move
  // writes the row the first one reads, so order matters.
  const std::vector<int32_t> src = {2, 5, 7}, dst = {1, 2, 7};
  pool.copy_slots(src, dst);
  EXPECT_EQ(row(pool.k_buffer(2), 1), before_k[2]);
  EXPECT_EQ(row(pool.k_buffer(2), 2), before_k[5]);
  EXPECT_EQ(row(pool.v_buffer(0), 1), before_v[2]);
  EXPECT_EQ(row(pool.v_buffer(0), 2), before_v[5]);
  for (int s : {0, 3, 4, 5, 6, 7, 8}) EXPECT_EQ(row(pool.k_buffer(2), s), before_k[static_cast<size_t>(s)]) << s;
  const std::vector<int32_t> bad = {16};
  EXPECT_THROW(pool.copy_slots(bad, std::vector<int32_t>{0}), Error);
  EXPECT_THROW(pool.copy_slots(src, std::vector<int32_t>{1}), Error);
}

}  // namespace
}  // namespace specula
