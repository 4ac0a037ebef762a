// What the CUDA attention test files share: fresh shapes, the check of a CUDA run against the
// harness's float64 reference, a decode step's config, and the fixture that skips without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <random>

#include "attention/attention_harness.h"
#include "specula/attention/cuda/cuda_backend.h"
#include "specula/core/device.h"

namespace specula::testing {

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

inline std::mt19937 rng_for_shapes() { return std::mt19937(static_cast<uint32_t>(fresh_seed())); }

// CUDA output against the f64 truth, within 2x the error of a same-precision naive reference
// (bf16 probabilities, output rounded to the io dtype) plus atol.
inline void check_cuda(HarnessConfig c, const char* what) {
  if (c.q_dtype == DType::f32) c.q_dtype = DType::bf16;
  if (c.kv_dtype == DType::f32) c.kv_dtype = c.q_dtype;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << what << " seed=" << seed);
  AttentionHarness h(c, seed);
  AttentionBackendOptions o = h.backend_options();
  o.device = Device::cuda(0);
  CudaAttentionBackend backend(o);
  const AttentionResult got = h.run_on_device(backend, Device::cuda(0));
  expect_close_to_reference(got, h.reference<double>(), h.reference<float>({}, true), 2e-3, what);
}

// A decode step (requests added by the caller); fp8 caches get descales.
inline HarnessConfig decode_config(int num_q_heads, int num_kv_heads, int page_size, DType kv_dtype) {
  HarnessConfig c;
  c.mode = ForwardMode::DECODE;
  c.num_q_heads = num_q_heads;
  c.num_kv_heads = num_kv_heads;
  c.page_size = page_size;
  c.kv_dtype = kv_dtype;
  if (kv_dtype == DType::fp8_e4m3) {
    c.k_scale = 0.027f;
    c.v_scale = 0.41f;
  }
  return c;
}

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_GPU(); }
};

}  // namespace specula::testing
