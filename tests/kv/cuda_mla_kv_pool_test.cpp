// MLAKVPool on a CUDA device against the same pool on the host: the device writes of latent rows
// (bf16 and fp8_ds_mla, from f32 / bf16 / f16 sources, strided like a fused projection's output)
// and of indexer keys leave exactly the host encoder's bytes (memcmp of whole buffers, edge tiles
// included: all-zero, huge outliers, subnormal maxima); device copy_slots equals the host's;
// device read_rows copies back what the host pool reads. Random finite inputs; the seed is
// printed and can be fixed with SPECULA_TEST_SEED. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device.h"
#include "specula/kv/mla_kv_pool.h"

namespace specula::testing {
namespace {

constexpr const char* kBinary = "cuda_kv_test";

// Random values, magnitude varying per 128-value block (10^-3 .. 10^3), never all zero. With
// `edges`, block 1 of row 0 is all zero, block 0 of row 1 holds a 1e30 outlier (only where the
// source dtype can hold it), and row 2's block 0 has a subnormal max whose scale loses precision.
std::vector<float> random_rows(std::mt19937_64& rng, int64_t rows, int64_t cols, DType dtype, bool edges) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  float magnitude = 1.0f;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % kMlaFp8TileSize == 0) magnitude = std::pow(10.0f, exponent(rng));
    v[i] = std::clamp(normal(rng) * magnitude, -60000.0f, 60000.0f);  // finite in f16 too
  }
  if (edges && cols >= 2 * kMlaFp8TileSize && rows >= 3) {
    std::fill(v.begin() + kMlaFp8TileSize, v.begin() + 2 * kMlaFp8TileSize, 0.0f);
    if (dtype != DType::f16) v[static_cast<size_t>(cols + 7)] = -1e30f;
    const float denorm = std::numeric_limits<float>::denorm_min();
    for (int i = 0; i < kMlaFp8TileSize; ++i) v[static_cast<size_t>(2 * cols + i)] = static_cast<float>(i % 9 - 4) * 64.0f * denorm;
    v[static_cast<size_t>(2 * cols + 5)] = 627.0f * denorm;
  }
  return v;
}

// A [rows, cols] view of `dtype` into a [rows, row_stride] host or device allocation at column
// offset `col`: kv_c and k_pe as slices of one fused [rows, kv_lora_rank + qk_rope_head_dim].
TensorView strided_view(const Buffer& fused, int64_t col, int64_t cols) {
  const int64_t stride = fused.shape()[1];
  auto* base = static_cast<char*>(fused.data()) + col * static_cast<int64_t>(dtype_size(fused.dtype()));
  return TensorView(base, fused.dtype(), Shape{fused.shape()[0], cols}, Shape{stride, 1}, fused.device());
}

Buffer to_device(const Buffer& host) {
  Buffer d(host.dtype(), host.shape(), Device::cuda());
  copy(d, host);
  return d;
}

std::vector<uint8_t> bytes_of(const TensorView& v) {
  std::vector<uint8_t> out(v.nbytes());
  copy(TensorView(out.data(), v.dtype(), v.shape()), v);
  return out;
}

// Distinct random slots.
std::vector<int32_t> random_slots(std::mt19937_64& rng, int64_t num_slots, int64_t n) {
  std::vector<int32_t> all(static_cast<size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n));
  return all;
}

Buffer device_loc(const std::vector<int32_t>& loc) {
  Buffer host(DType::i32, {static_cast<int64_t>(loc.size())});
  std::copy(loc.begin(), loc.end(), host.data_as<int32_t>());
  return to_device(host);
}

void expect_same_buffers(const MLAKVPool& host, const MLAKVPool& device) {
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int l = 0; l < host.num_layers(); ++l) {
    const std::vector<uint8_t> h = bytes_of(host.kv_buffer(l)), d = bytes_of(device.kv_buffer(l));
    ASSERT_EQ(h.size(), d.size());
    const auto diff = std::mismatch(h.begin(), h.end(), d.begin());
    EXPECT_EQ(std::memcmp(h.data(), d.data(), h.size()), 0)
        << "layer " << l << " latent byte " << (diff.first - h.begin()) << " (slot " << (diff.first - h.begin()) / host.row_bytes()
        << "): host " << int{*diff.first} << " device " << int{*diff.second};
    if (host.config().index_head_dim == 0) continue;
    const std::vector<uint8_t> hi = bytes_of(host.index_buffer(l)), di = bytes_of(device.index_buffer(l));
    const auto idiff = std::mismatch(hi.begin(), hi.end(), di.begin());
    EXPECT_EQ(std::memcmp(hi.data(), di.data(), hi.size()), 0)
        << "layer " << l << " index byte " << (idiff.first - hi.begin()) << ": host " << int{*idiff.first} << " device "
        << int{*idiff.second};
  }
}

struct LatentCase {
  MlaKVFormat format;
  int kv_lora_rank, qk_rope_head_dim;
  int64_t num_tokens;
};

TEST(CudaMLAKVPool, LatentWriteEqualsHostEncoderBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary));
  const std::vector<LatentCase> cases = {
      {MlaKVFormat::fp8_ds_mla, 512, 64, 37}, {MlaKVFormat::fp8_ds_mla, 512, 64, 1}, {MlaKVFormat::fp8_ds_mla, 128, 32, 5},
      {MlaKVFormat::fp8_ds_mla, 1024, 64, 9}, {MlaKVFormat::bf16, 512, 64, 37},      {MlaKVFormat::bf16, 512, 64, 1},
      {MlaKVFormat::bf16, 96, 17, 6}};
  for (const LatentCase& c : cases) {
    for (DType src : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(::testing::Message() << mla_kv_format_name(c.format) << " " << c.kv_lora_rank << "+" << c.qk_rope_head_dim
                                        << " tokens " << c.num_tokens << " from " << dtype_name(src));
      const MLAKVPoolConfig config{64, 2, c.kv_lora_rank, c.qk_rope_head_dim, c.format, 0, Device::cpu()};
      MLAKVPoolConfig device_config = config;
      device_config.device = Device::cuda();
      MLAKVPool host(config), device(device_config);
      const int64_t width = c.kv_lora_rank + c.qk_rope_head_dim;
      const std::vector<int32_t> loc = random_slots(rng, config.num_slots, c.num_tokens);
      const Buffer d_loc = device_loc(loc);
      for (int layer : {1, 0}) {
        const std::vector<float> values = random_rows(rng, c.num_tokens, width, src, layer == 1);
        Buffer fused(src, {c.num_tokens, width});
        convert_from_float(values.data(), fused.data(), src, values.size());
        const Buffer d_fused = to_device(fused);
        host.set_mla_kv_buffer(layer, loc, strided_view(fused, 0, c.kv_lora_rank),
                               strided_view(fused, c.kv_lora_rank, c.qk_rope_head_dim));
        device.set_mla_kv_buffer(layer, d_loc.view(), strided_view(d_fused, 0, c.kv_lora_rank),
                                 strided_view(d_fused, c.kv_lora_rank, c.qk_rope_head_dim), nullptr);
        expect_same_buffers(host, device);  // synchronises before d_fused goes
      }
    }
  }
}

TEST(CudaMLAKVPool, IndexKeyWriteEqualsHostEncoderBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary));
  for (int d : {16, 64, 128, 256}) {
    for (int64_t n : {int64_t{1}, int64_t{4}, int64_t{37}}) {
      for (DType src : {DType::f32, DType::bf16, DType::f16}) {
        SCOPED_TRACE(::testing::Message() << "index_head_dim " << d << " tokens " << n << " from " << dtype_name(src));
        const MLAKVPoolConfig config{48, 2, 512, 64, MlaKVFormat::fp8_ds_mla, d, Device::cpu()};
        MLAKVPoolConfig device_config = config;
        device_config.device = Device::cuda();
        MLAKVPool host(config), device(device_config);
        const std::vector<int32_t> loc = random_slots(rng, config.num_slots, n);
        const std::vector<float> values = random_rows(rng, n, d, src, d >= 2 * kMlaFp8TileSize);
        std::vector<float> keys = values;
        if (n >= 2) std::fill(keys.begin() + d, keys.begin() + 2 * d, 0.0f);  // an all-zero key
        Buffer k(src, {n, d});
        convert_from_float(keys.data(), k.data(), src, keys.size());
        host.set_index_k(1, loc, k);
        // Named, not temporaries: the kernel may still read them after the call returns.
        const Buffer d_loc = device_loc(loc), d_k = to_device(k);
        device.set_index_k(1, d_loc.view(), d_k.view(), nullptr);
        expect_same_buffers(host, device);
      }
    }
  }
}

TEST(CudaMLAKVPool, CopySlotsAndReadRowsMatchTheHostPool) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed(kBinary));
  for (MlaKVFormat format : {MlaKVFormat::fp8_ds_mla, MlaKVFormat::bf16}) {
    SCOPED_TRACE(mla_kv_format_name(format));
    const MLAKVPoolConfig config{24, 3, 512, 64, format, 128, Device::cpu()};
    MLAKVPoolConfig device_config = config;
    device_config.device = Device::cuda();
    MLAKVPool host(config), device(device_config);
    // Every slot of every layer written with the same data on both sides.
    std::vector<int32_t> all(24);
    std::iota(all.begin(), all.end(), 0);
    const Buffer d_all = device_loc(all);
    for (int l = 0; l < 3; ++l) {
      Buffer c(DType::f32, {24, 512}), pe(DType::f32, {24, 64}), k(DType::f32, {24, 128});
      for (Buffer* b : {&c, &pe, &k}) {
        const std::vector<float> v = random_rows(rng, b->shape()[0], b->shape()[1], DType::f32, false);
        std::copy(v.begin(), v.end(), b->data_as<float>());
      }
      host.set_mla_kv_buffer(l, all, c, pe);
      host.set_index_k(l, all, k);
      const Buffer d_c = to_device(c), d_pe = to_device(pe), d_k = to_device(k);
      device.set_mla_kv_buffer(l, d_all.view(), d_c.view(), d_pe.view(), nullptr);
      device.set_index_k(l, d_all.view(), d_k.view(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    expect_same_buffers(host, device);
    // Overlapping moves (the second writes the first one's source), a no-op and a plain move,
    // twice, so the second call reuses the uploaded tables.
    const std::vector<int32_t> src{2, 5, 7, 20}, dst{1, 2, 7, 0};
    for (int round = 0; round < 2; ++round) {
      host.copy_slots(src, dst);
      device.copy_slots(src, dst, nullptr);
      expect_same_buffers(host, device);
    }
    const std::vector<int32_t> slots{0, 1, 2, 23, 7};
    std::vector<float> h(slots.size() * 576), d(slots.size() * 576);
    host.read_rows(2, slots, h.data());
    device.read_rows(2, slots, d.data());
    EXPECT_EQ(std::memcmp(h.data(), d.data(), h.size() * sizeof(float)), 0);
    std::vector<float> hk(slots.size() * 128), dk(slots.size() * 128);
    host.read_index_rows(1, slots, hk.data());
    device.read_index_rows(1, slots, dk.data());
    EXPECT_EQ(std::memcmp(hk.data(), dk.data(), hk.size() * sizeof(float)), 0);
  }
}

TEST(CudaMLAKVPool, EmptyWriteAndHostSlotsAreHandled) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  MLAKVPool device(MLAKVPoolConfig{8, 1, 512, 64, MlaKVFormat::fp8_ds_mla, 64, Device::cuda()});
  const Buffer loc(DType::i32, {0}, Device::cuda());
  const Buffer c(DType::bf16, {0, 512}, Device::cuda()), pe(DType::bf16, {0, 64}, Device::cuda());
  const Buffer k(DType::bf16, {0, 64}, Device::cuda());
  device.set_mla_kv_buffer(0, loc.view(), c, pe, nullptr);
  device.set_index_k(0, loc.view(), k, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  // The host-slot overloads are for host pools; the message says what to pass instead.
  EXPECT_THROW(device.set_mla_kv_buffer(0, std::vector<int32_t>{}, c, pe), Error);
  EXPECT_THROW(device.set_index_k(0, std::vector<int32_t>{}, k), Error);
}

}  // namespace
}  // namespace specula::testing
