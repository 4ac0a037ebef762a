// CudaLinear's fused decode products on the GPU: the gated MLP product (GEMV + activation in one
// launch) and the product over bf16 activations, each against a float64 reference and bit for bit
// against the unfused path it replaces, for GEMV row counts and the GEMM fallback. Skipped where
// no GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/fused_ops.h"
#include "specula/model/cuda/gemv.h"
#include "specula/model/cuda/model_ops.h"

namespace specula {
namespace {

float round_bf16(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  return std::bit_cast<float>((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}

std::vector<float> random_bf16_values(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(d(rng));
  return v;
}

Buffer device_f32(const std::vector<float>& v) { return upload_f32(v, Device::cuda(0)); }

Buffer device_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(v[i]) >> 16);
  Buffer b(DType::bf16, {static_cast<int64_t>(v.size())}, Device::cuda(0));
  copy(b, TensorView(bits.data(), DType::bf16, {static_cast<int64_t>(v.size())}));
  return b;
}

std::vector<float> host(const Buffer& b) {
  std::vector<float> v(static_cast<size_t>(b.numel()));
  CUDA_CHECK(cudaDeviceSynchronize());
  copy(TensorView(v.data(), DType::f32, {b.numel()}), b);
  return v;
}

double dot(const std::vector<float>& x, int64_t r, const std::vector<float>& w, int64_t o, int in) {
  double s = 0.0;
  for (int i = 0; i < in; ++i) s += static_cast<double>(x[r * in + i]) * w[o * in + i];
  return s;
}

class CudaLinearTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::mt19937 rng_{static_cast<uint32_t>(testing::test_seed("cuda_linear_test"))};
};

TEST_F(CudaLinearTest, GatedProductMatchesReferenceAndTheUnfusedPath) {
  CudaLinear linear(Device::cuda(0), stream_, false);
  // Odd feature counts (the last warp's second output is past the end); small matrices (the tiny
  // kernel, rows of 776 split over four warps) and larger ones (rows of 776 on one warp per
  // feature group, of 2048 on two).
  for (auto [inter, in, gelu] : {std::tuple{203, 776, false}, std::tuple{203, 776, true}, std::tuple{701, 776, false},
                                 std::tuple{301, 2048, false}}) {
    const std::vector<float> w = random_bf16_values(rng_, static_cast<size_t>(2 * inter) * in, 0.05f);
    const Buffer wd = device_bf16(w);
    for (int n : {1, 2, 5, 8, 12}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " in=" << in << " inter=" << inter << " gelu=" << gelu);
      const std::vector<float> x = random_bf16_values(rng_, static_cast<size_t>(n) * in, 1.0f);
      const Buffer xd = device_f32(x);
      Buffer fused(DType::f32, {int64_t{n} * inter}, Device::cuda(0));
      Buffer gate_up(DType::f32, {int64_t{n} * 2 * inter}, Device::cuda(0));
      Buffer unfused(DType::f32, {int64_t{n} * inter}, Device::cuda(0));
      Buffer hi(DType::bf16, {int64_t{n} * in}, Device::cuda(0)), lo(DType::bf16, {int64_t{n} * in}, Device::cuda(0));
      linear.gated(xd.data_as<float>(), wd, Buffer{}, fused.data_as<float>(), n, in, inter, gelu,
                   gate_up.data_as<float>(), hi.data(), lo.data());
      linear(xd.data_as<float>(), wd, Buffer{}, gate_up.data_as<float>(), n, in, 2 * inter, hi.data(), lo.data());
      cuda_kernels::gated_activation_fused(gate_up.data_as<float>(), unfused.data_as<float>(), n, inter, gelu, stream_);
      const std::vector<float> got = host(fused), want = host(unfused);
      for (int r = 0; r < n; ++r) {
        for (int o = 0; o < inter; ++o) {
          const size_t i = static_cast<size_t>(r) * inter + o;
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "row " << r << " feature " << o;
          const double g = dot(x, r, w, o, in), u = dot(x, r, w, inter + o, in);
          const double act = gelu ? 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
                                  : g / (1.0 + std::exp(-g));
          ASSERT_NEAR(got[i], act * u, 1e-4 * (1.0 + std::abs(act * u))) << "row " << r << " feature " << o;
        }
      }
    }
  }
}

// Every row of a GEMV of n rows is bit for bit the GEMV of that row alone (what the deterministic
// mode's batch invariance stands on) and matches float64, for each of the kernel's shapes: tiny
// matrices with rows walked by one warp or split over four, larger ones with one or two warps
// per feature group.
TEST_F(CudaLinearTest, GemvRowsAreBatchInvariantAndMatchReference) {
  for (auto [in, out] : {std::pair{256, 259}, std::pair{640, 256}, std::pair{1024, 1100}, std::pair{2048, 777}}) {
    const std::vector<float> w = random_bf16_values(rng_, static_cast<size_t>(out) * in, 0.05f);
    const Buffer wd = device_bf16(w);
    const int max_rows = cuda_kernels::kGemvMaxRows;
    const std::vector<float> x = random_bf16_values(rng_, static_cast<size_t>(max_rows) * in, 1.0f);
    const Buffer xd = device_f32(x);
    Buffer alone(DType::f32, {int64_t{max_rows} * out}, Device::cuda(0));
    Buffer batch(DType::f32, {int64_t{max_rows} * out}, Device::cuda(0));
    for (int r = 0; r < max_rows; ++r) {
      cuda_kernels::gemv_bf16(wd.data(), xd.data_as<float>() + int64_t{r} * in, alone.data_as<float>() + int64_t{r} * out, 1,
                              in, out, stream_);
    }
    const std::vector<float> want = host(alone);
    for (int n = 2; n <= max_rows; ++n) {
      SCOPED_TRACE(::testing::Message() << "in=" << in << " out=" << out << " n=" << n);
      CUDA_CHECK(cudaMemsetAsync(batch.data(), 0xff, batch.nbytes(), stream_));  // NaN: rows left unwritten show
      cuda_kernels::gemv_bf16(wd.data(), xd.data_as<float>(), batch.data_as<float>(), n, in, out, stream_);
      const std::vector<float> got = host(batch);
      for (size_t i = static_cast<size_t>(n) * out; i < got.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), 0xffffffffu) << "rows past " << n << " were written";
      }
      for (int r = 0; r < n; ++r) {
        for (int o = 0; o < out; ++o) {
          const size_t i = static_cast<size_t>(r) * out + o;
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "row " << r << " feature " << o;
          const double ref = dot(x, r, w, o, in);
          ASSERT_NEAR(got[i], ref, 1e-4 * (1.0 + std::abs(ref))) << "row " << r << " feature " << o;
        }
      }
    }
  }
}

TEST_F(CudaLinearTest, Bf16ActivationsMatchReferenceAndTheF32Path) {
  CudaLinear linear(Device::cuda(0), stream_, false);
  // Rows of 2048: a tiny matrix (four warps per feature) and a larger one (two warps per group).
  const int in = 2048;
  for (int out : {333, 777}) {
    const std::vector<float> w = random_bf16_values(rng_, static_cast<size_t>(out) * in, 0.05f);
    const std::vector<float> bias = random_bf16_values(rng_, static_cast<size_t>(out), 0.5f);
    const Buffer wd = device_bf16(w), bd = device_f32(bias);
    for (int n : {1, 3, 8, 20}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " out=" << out);
      const std::vector<float> x = random_bf16_values(rng_, static_cast<size_t>(n) * in, 1.0f);
      const Buffer xb = device_bf16(x);
      Buffer x_f32(DType::f32, {int64_t{n} * in}, Device::cuda(0));
      Buffer got_d(DType::f32, {int64_t{n} * out}, Device::cuda(0)), want_d(DType::f32, {int64_t{n} * out}, Device::cuda(0));
      Buffer hi(DType::bf16, {int64_t{n} * in}, Device::cuda(0)), lo(DType::bf16, {int64_t{n} * in}, Device::cuda(0));
      linear.product_bf16_x(xb.data(), wd, bd, got_d.data_as<float>(), n, in, out, x_f32.data_as<float>());
      cuda_kernels::bf16_to_f32(xb.data(), x_f32.data_as<float>(), int64_t{n} * in, stream_);
      linear(x_f32.data_as<float>(), wd, bd, want_d.data_as<float>(), n, in, out, hi.data(), lo.data());
      const std::vector<float> got = host(got_d), want = host(want_d);
      for (int r = 0; r < n; ++r) {
        for (int o = 0; o < out; ++o) {
          const size_t i = static_cast<size_t>(r) * out + o;
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "row " << r << " feature " << o;
          const double ref = dot(x, r, w, o, in) + bias[static_cast<size_t>(o)];
          ASSERT_NEAR(got[i], ref, 1e-4 * (1.0 + std::abs(ref))) << "row " << r << " feature " << o;
        }
      }
    }
  }
}

}  // namespace
}  // namespace specula
