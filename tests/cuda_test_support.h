// Helpers shared by the CUDA kernel tests: the printed, repeatable random seed, an owning device
// array, bf16 conversion, and random tree_attention inputs with their device copies.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "specula/attention/cuda/kernels/tree_attention.h"
#include "specula/core/cuda_check.h"

namespace specula::testing {

// One seed per test binary: SPECULA_TEST_SEED when set, random otherwise; printed (with
// binary_name) on first use so that a failing run can be repeated.
inline uint64_t test_seed(const char* binary_name) {
  static const uint64_t seed = [binary_name] {
    const char* env = std::getenv("SPECULA_TEST_SEED");
    const uint64_t s = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("%s seed %llu (set SPECULA_TEST_SEED to repeat)\n", binary_name, static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// A device array; owns its memory.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    void* raw = nullptr;
    CUDA_CHECK(cudaMalloc(&raw, std::max<size_t>(n, 1) * sizeof(T)));
    ptr_ = static_cast<T*>(raw);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr_); }
  void upload(const std::vector<T>& host) {
    SPECULA_REQUIRE(host.size() == n_, "upload size mismatch");
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void fill_bytes(int value) { CUDA_CHECK(cudaMemset(ptr_, value, n_ * sizeof(T))); }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

inline uint16_t to_bf16(float x) {  // round to nearest even (inputs are finite)
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }

// The host inputs of one tree_attention launch (bf16 bits for q and the caches); p holds the
// shape but no device pointers. p.branch_len < 0 means per-row lengths (branch_lens); otherwise
// branch_lens, when filled, is for the host reference only.
struct TreeAttentionInputs {
  cuda_kernels::TreeAttentionParams p{};
  std::vector<uint16_t> q, k_cache, v_cache;
  std::vector<int32_t> pages, prefix_lens, branch_slots, branch_lens;
};

// The shape of one tree_attention launch: TreeAttentionParams less its pointers and LSE output.
struct TreeAttentionShape {
  int rows, rows_per_seq, num_kv_heads, group, head_dim;
  float scale;
  int page_stride, page_size, branch_stride;
  int branch_len;  // -1: per-row branch_lens
};

// Sets in.p to `shape` (no device pointers), then draws random bf16 q for its rows and q heads
// (uniform in [-2, 2)) and K and V caches of num_slots slots (uniform in [-1, 1)), in that order.
inline void set_shape_and_random_qkv(TreeAttentionInputs& in, const TreeAttentionShape& shape, size_t num_slots,
                                     std::mt19937_64& rng) {
  in.p = {};
  in.p.rows = shape.rows;
  in.p.rows_per_seq = shape.rows_per_seq;
  in.p.num_q_heads = shape.num_kv_heads * shape.group;
  in.p.num_kv_heads = shape.num_kv_heads;
  in.p.head_dim = shape.head_dim;
  in.p.scale = shape.scale;
  in.p.page_stride = shape.page_stride;
  in.p.page_size = shape.page_size;
  in.p.branch_stride = shape.branch_stride;
  in.p.branch_len = shape.branch_len;
  std::uniform_real_distribution<float> qd(-2.0f, 2.0f), kvd(-1.0f, 1.0f);
  const size_t D = static_cast<size_t>(shape.head_dim);
  in.q.resize(static_cast<size_t>(in.p.rows) * in.p.num_q_heads * D);
  for (auto& x : in.q) x = to_bf16(qd(rng));
  in.k_cache.resize(num_slots * in.p.num_kv_heads * D);
  in.v_cache.resize(in.k_cache.size());
  for (auto& x : in.k_cache) x = to_bf16(kvd(rng));
  for (auto& x : in.v_cache) x = to_bf16(kvd(rng));
}

// TreeAttentionInputs on the device, with p pointing at them (out: uninitialised, as large as q).
struct DeviceTreeAttention {
  explicit DeviceTreeAttention(const TreeAttentionInputs& in)
      : q(in.q),
        k_cache(in.k_cache),
        v_cache(in.v_cache),
        out(in.q.size()),
        pages(in.pages),
        prefix_lens(in.prefix_lens),
        branch_slots(in.branch_slots),
        branch_lens(in.branch_lens),
        p(in.p) {
    p.q = q.get();
    p.k_cache = k_cache.get();
    p.v_cache = v_cache.get();
    p.out = out.get();
    p.prefix_pages = pages.get();
    p.prefix_lens = prefix_lens.get();
    p.branch_slots = branch_slots.get();
    p.branch_lens = in.p.branch_len < 0 ? branch_lens.get() : nullptr;
  }

  DeviceArray<uint16_t> q, k_cache, v_cache, out;
  DeviceArray<int32_t> pages, prefix_lens, branch_slots, branch_lens;
  cuda_kernels::TreeAttentionParams p;
};

}  // namespace specula::testing
