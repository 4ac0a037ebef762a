// The q/k/v epilogue with the KV write folded in: K and V land in the paged cache exactly as the
// separate path (epilogue into k / v, then set_kv_buffer) puts them there, bf16 and fp8 caches,
// with per-head norms and RoPE, and the cache rows match a float64 reference; q is the same
// either way; slots no token maps to are left alone. Dual chunk attention's q variants and key
// positions against float64 rows. add_rms_norm_rows against float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/dtype_codes.h"
#include "specula/core/device.h"
#include "specula/kv/cuda/set_kv_buffer.h"
#include "specula/model/cuda/fused_ops.h"

namespace specula {
namespace {

namespace ck = cuda_kernels;
using testing::DeviceArray;
using testing::from_bf16;

struct EpilogueCase {
  int n, num_q_heads, num_kv_heads, head_dim;
  bool norms;
  int cache_dtype;
  float k_scale, v_scale;
};

float fp8_e4m3_to_float(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  const double v = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return static_cast<float>(sign ? -v : v);
}

// The float64 value of head row `head` (q | k | v order) of token t after norm and RoPE.
std::vector<double> reference_row(const std::vector<float>& qkv, const std::vector<float>& norm_w, int t, int head,
                                  const EpilogueCase& c, int position, const std::vector<float>& inv_freq,
                                  bool rope, bool normed) {
  const int D = c.head_dim, heads = c.num_q_heads + 2 * c.num_kv_heads;
  std::vector<double> x(static_cast<size_t>(D));
  for (int i = 0; i < D; ++i) x[static_cast<size_t>(i)] = qkv[(static_cast<size_t>(t) * heads + head) * D + i];
  if (normed) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
    for (int i = 0; i < D; ++i) x[static_cast<size_t>(i)] = norm_w[static_cast<size_t>(i)] * x[static_cast<size_t>(i)] * inv;
  }
  if (!rope) return x;
  std::vector<double> y(x);
  for (int i = 0; i < D / 2; ++i) {
    const double angle = static_cast<double>(static_cast<float>(position) * inv_freq[static_cast<size_t>(i)]);
    const double a = x[static_cast<size_t>(i)], b = x[static_cast<size_t>(i + D / 2)];
    y[static_cast<size_t>(i)] = a * std::cos(angle) - b * std::sin(angle);
    y[static_cast<size_t>(i + D / 2)] = b * std::cos(angle) + a * std::sin(angle);
  }
  return y;
}

class CudaQkvEpilogue : public ::testing::TestWithParam<EpilogueCase> {};

TEST_P(CudaQkvEpilogue, CacheWriteEqualsTheSeparateWrite) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const EpilogueCase c = GetParam();
  std::mt19937_64 rng(testing::test_seed("cuda_model_test") + static_cast<uint64_t>(c.head_dim * 7 + c.n));
  const int D = c.head_dim, heads = c.num_q_heads + 2 * c.num_kv_heads;
  const int num_slots = 3 * c.n + 5;
  const bool fp8 = c.cache_dtype == ck::kFp8E4m3;
  const size_t elem = fp8 ? 1 : 2;
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f), wdist(0.5f, 1.5f);
  std::vector<float> qkv(static_cast<size_t>(c.n) * heads * D), q_norm(static_cast<size_t>(D)), k_norm(q_norm.size()),
      inv_freq(static_cast<size_t>(D / 2));
  for (float& x : qkv) x = dist(rng);
  for (float& x : q_norm) x = wdist(rng);
  for (float& x : k_norm) x = wdist(rng);
  for (int i = 0; i < D / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / D);
  std::vector<int32_t> positions(static_cast<size_t>(c.n)), slots(static_cast<size_t>(num_slots));
  std::uniform_int_distribution<int32_t> pos_dist(0, 4000);
  for (int32_t& p : positions) p = pos_dist(rng);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(static_cast<size_t>(c.n));  // distinct, scattered destinations

  DeviceArray<float> d_qkv(qkv), d_qn(q_norm), d_kn(k_norm), d_freq(inv_freq);
  DeviceArray<int32_t> d_pos(positions), d_loc(slots);
  const size_t q_elems = static_cast<size_t>(c.n) * c.num_q_heads * D, kv_elems = static_cast<size_t>(c.n) * c.num_kv_heads * D;
  const size_t cache_bytes = static_cast<size_t>(num_slots) * c.num_kv_heads * D * elem;
  DeviceArray<uint16_t> q_sep(q_elems), q_fused(q_elems), k_sep(kv_elems), v_sep(kv_elems);
  DeviceArray<uint8_t> kc_sep(cache_bytes), vc_sep(cache_bytes), kc_fused(cache_bytes), vc_fused(cache_bytes);
  for (auto* a : {&kc_sep, &vc_sep, &kc_fused, &vc_fused}) a->fill_bytes(0x3c);

  ck::QkvEpilogueParams e{};
  e.qkv = d_qkv.get();
  e.positions = d_pos.get();
  e.inv_freq = d_freq.get();
  e.rope_factor = 1.0f;
  e.q_norm = c.norms ? d_qn.get() : nullptr;
  e.k_norm = c.norms ? d_kn.get() : nullptr;
  e.eps = 1e-6f;
  e.n = c.n;
  e.num_q_heads = c.num_q_heads;
  e.num_kv_heads = c.num_kv_heads;
  e.head_dim = D;
  // Separate: the epilogue into k / v, then set_kv_buffer.
  e.q = q_sep.get();
  e.k = k_sep.get();
  e.v = v_sep.get();
  ck::qkv_epilogue(e, nullptr);
  ck::SetKVParams w{};
  w.k = k_sep.get();
  w.v = v_sep.get();
  w.k_stride = w.v_stride = static_cast<int64_t>(c.num_kv_heads) * D;
  w.src_dtype = ck::kBF16;
  w.k_cache = kc_sep.get();
  w.v_cache = vc_sep.get();
  w.cache_dtype = c.cache_dtype;
  w.loc = d_loc.get();
  w.num_tokens = c.n;
  w.row_k = w.row_v = c.num_kv_heads * D;
  w.k_scale = c.k_scale;
  w.v_scale = c.v_scale;
  ck::launch_set_kv_buffer(w, nullptr);
  // Fused: the epilogue writes the cache itself.
  e.q = q_fused.get();
  e.k = e.v = nullptr;
  e.k_cache = kc_fused.get();
  e.v_cache = vc_fused.get();
  e.cache_loc = d_loc.get();
  e.cache_dtype = c.cache_dtype;
  e.k_scale = c.k_scale;
  e.v_scale = c.v_scale;
  ck::qkv_epilogue(e, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  EXPECT_EQ(q_fused.download(), q_sep.download());
  const std::vector<uint8_t> kf = kc_fused.download(), vf = vc_fused.download();
  EXPECT_EQ(kf, kc_sep.download());
  EXPECT_EQ(vf, vc_sep.download());

  // The cache rows against float64: bf16 rounding (and fp8's 3-bit mantissa) of the reference.
  const double rel = fp8 ? 0.07 : 0.008;
  auto cached = [&](const std::vector<uint8_t>& cache, size_t index, float scale) {
    if (fp8) return static_cast<double>(fp8_e4m3_to_float(cache[index])) * scale;
    uint16_t bits;
    std::copy_n(cache.data() + 2 * index, 2, reinterpret_cast<uint8_t*>(&bits));
    return static_cast<double>(from_bf16(bits));
  };
  for (int t = 0; t < c.n; ++t) {
    for (int g = 0; g < c.num_kv_heads; ++g) {
      const std::vector<double> k = reference_row(qkv, k_norm, t, c.num_q_heads + g, c, positions[static_cast<size_t>(t)],
                                                  inv_freq, true, c.norms);
      const std::vector<double> v =
          reference_row(qkv, k_norm, t, c.num_q_heads + c.num_kv_heads + g, c, 0, inv_freq, false, false);
      for (int i = 0; i < D; ++i) {
        const size_t at = (static_cast<size_t>(slots[static_cast<size_t>(t)]) * c.num_kv_heads + g) * D + i;
        const double ek = std::abs(cached(kf, at, c.k_scale) - k[static_cast<size_t>(i)]);
        const double ev = std::abs(cached(vf, at, c.v_scale) - v[static_cast<size_t>(i)]);
        ASSERT_LE(ek, rel * std::abs(k[static_cast<size_t>(i)]) + 2e-3 * c.k_scale) << "k token " << t << " head " << g << " dim " << i;
        ASSERT_LE(ev, rel * std::abs(v[static_cast<size_t>(i)]) + 2e-3 * c.v_scale) << "v token " << t << " head " << g << " dim " << i;
      }
    }
  }
  // Slots no token maps to keep their fill.
  std::vector<bool> used(static_cast<size_t>(num_slots), false);
  for (int32_t s : slots) used[static_cast<size_t>(s)] = true;
  const size_t row_bytes = static_cast<size_t>(c.num_kv_heads) * D * elem;
  for (int s = 0; s < num_slots; ++s) {
    if (used[static_cast<size_t>(s)]) continue;
    for (size_t b = 0; b < row_bytes; ++b) {
      ASSERT_EQ(kf[static_cast<size_t>(s) * row_bytes + b], 0x3c) << "k slot " << s;
      ASSERT_EQ(vf[static_cast<size_t>(s) * row_bytes + b], 0x3c) << "v slot " << s;
    }
  }
}

// Dual chunk attention: each q head as its three (or five) rotary variants, keys at pos % chunk_len
// times their temperature, against float64 rows at the positions Qwen2.5-1M's rotary places them.
TEST(CudaQkvEpilogueDualChunk, VariantsAndKeysAtTheirPositions) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = testing::test_seed("cuda_model_test_dca");
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const EpilogueCase c{23, 6, 2, 64, true, ck::kBF16, 1.0f, 1.0f};
  const int D = c.head_dim, heads = c.num_q_heads + 2 * c.num_kv_heads, cl = 48, cs = 56;
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f), wdist(0.5f, 1.5f), sdist(1.0f, 1.6f);
  std::vector<float> qkv(static_cast<size_t>(c.n) * heads * D), q_norm(static_cast<size_t>(D)), k_norm(q_norm.size()),
      inv_freq(static_cast<size_t>(D / 2)), key_scale(static_cast<size_t>(c.n));
  for (float& x : qkv) x = dist(rng);
  for (float& x : q_norm) x = wdist(rng);
  for (float& x : k_norm) x = wdist(rng);
  for (float& x : key_scale) x = sdist(rng);
  for (int i = 0; i < D / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / D);
  std::vector<int32_t> positions(static_cast<size_t>(c.n));
  std::uniform_int_distribution<int32_t> pos_dist(0, 400);
  for (int32_t& p : positions) p = pos_dist(rng);
  DeviceArray<float> d_qkv(qkv), d_qn(q_norm), d_kn(k_norm), d_freq(inv_freq), d_scale(key_scale);
  DeviceArray<int32_t> d_pos(positions);
  for (const int variants : {3, 5}) {
    DeviceArray<uint16_t> q(static_cast<size_t>(c.n) * c.num_q_heads * variants * D),
        k(static_cast<size_t>(c.n) * c.num_kv_heads * D), v(static_cast<size_t>(c.n) * c.num_kv_heads * D);
    ck::QkvEpilogueParams e{};
    e.qkv = d_qkv.get();
    e.positions = d_pos.get();
    e.inv_freq = d_freq.get();
    e.rope_factor = 1.0f;
    e.q_norm = d_qn.get();
    e.k_norm = d_kn.get();
    e.eps = 1e-6f;
    e.q = q.get();
    e.k = k.get();
    e.v = v.get();
    e.n = c.n;
    e.num_q_heads = c.num_q_heads;
    e.num_kv_heads = c.num_kv_heads;
    e.head_dim = D;
    e.dca_chunk_len = cl;
    e.dca_chunk_size = cs;
    e.q_variants = variants;
    e.key_scale = d_scale.get();
    ck::qkv_epilogue(e, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> qh = q.download(), kh = k.download();
    auto near = [](double got, double want) { return std::abs(got - want) <= 0.008 * std::abs(want) + 2e-3; };
    for (int t = 0; t < c.n; ++t) {
      const int p = positions[static_cast<size_t>(t)], in_chunk = p % cl;
      const int at[5] = {in_chunk, std::min(in_chunk + cl, cs), std::min(2 * cl - 1, cs), in_chunk + cl, in_chunk + cs};
      for (int h = 0; h < c.num_q_heads; ++h) {
        for (int var = 0; var < variants; ++var) {
          const std::vector<double> want = reference_row(qkv, q_norm, t, h, c, at[var], inv_freq, true, true);
          for (int i = 0; i < D; ++i) {
            const double got = from_bf16(qh[((static_cast<size_t>(t) * c.num_q_heads + h) * variants + var) * D + i]);
            ASSERT_TRUE(near(got, want[static_cast<size_t>(i)])) << "q token " << t << " head " << h << " variant " << var;
          }
        }
      }
      for (int g = 0; g < c.num_kv_heads; ++g) {
        const std::vector<double> want = reference_row(qkv, k_norm, t, c.num_q_heads + g, c, in_chunk, inv_freq, true, true);
        for (int i = 0; i < D; ++i) {
          const double got = from_bf16(kh[(static_cast<size_t>(t) * c.num_kv_heads + g) * D + i]);
          ASSERT_TRUE(near(got, want[static_cast<size_t>(i)] * key_scale[static_cast<size_t>(t)])) << "k token " << t << " head " << g;
        }
      }
    }
  }
}

// add_rms_norm_rows against float64: x += o, y = w * x / rms(x), the new x also copied out (or
// not), over widths of each path (one float4 a thread up to 4096; two; three and four in the
// four-slot kernel) and of the general loop (a width that is not a multiple of 4, one past four
// float4s a thread, and rows that are not 16-byte aligned).
TEST(CudaAddRmsNorm, MatchesFloat64AtEveryWidth) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(static_cast<uint32_t>(testing::test_seed("cuda_fused_ops_test")) ^ 0xadd);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    int width;
    bool copy;
    int offset;  // floats the rows start past an aligned allocation
  };
  for (const Case& c : {Case{64, true, 0}, Case{2048, false, 0}, Case{4096, true, 0}, Case{7168, false, 0},
                        Case{8192, true, 0}, Case{12288, true, 0}, Case{16384, false, 0}, Case{2050, true, 0},
                        Case{20480, false, 0}, Case{4096, true, 1}}) {
    const int width = c.width;
    SCOPED_TRACE(::testing::Message() << "width " << width << (c.copy ? ", copied" : "") << ", offset " << c.offset);
    const int64_t rows = 5, copy_stride = width + 4;
    std::vector<float> x(static_cast<size_t>(rows * width)), o(x.size()), w(static_cast<size_t>(width));
    for (float& v : x) v = normal(rng);
    for (float& v : o) v = 0.5f * normal(rng);
    for (float& v : w) v = 1.0f + 0.1f * normal(rng);
    // Each array starts c.offset floats into its allocation.
    auto padded = [&](const std::vector<float>& v) {
      std::vector<float> p(static_cast<size_t>(c.offset), 0.0f);
      p.insert(p.end(), v.begin(), v.end());
      return p;
    };
    DeviceArray<float> dx(padded(x)), dout(padded(o)), dw(padded(w)), dy(static_cast<size_t>(c.offset + rows * width)),
        dc(static_cast<size_t>(rows * copy_stride));
    dy.fill_bytes(0xff);
    dc.fill_bytes(0xff);
    ck::add_rms_norm_rows(dx.get() + c.offset, dout.get() + c.offset, dw.get() + c.offset, dy.get() + c.offset, rows,
                          width, 1e-6f, nullptr, c.copy ? dc.get() : nullptr, copy_stride);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto unpadded = [&](const DeviceArray<float>& d) {
      const std::vector<float> all = d.download();
      return std::vector<float>(all.begin() + c.offset, all.end());
    };
    const std::vector<float> gx = unpadded(dx), gy = unpadded(dy), gc = dc.download();
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      std::vector<double> v(static_cast<size_t>(width));
      for (int i = 0; i < width; ++i) {
        const size_t at = static_cast<size_t>(r * width + i);
        v[static_cast<size_t>(i)] = static_cast<double>(x[at]) + o[at];
        ss += v[static_cast<size_t>(i)] * v[static_cast<size_t>(i)];
        ASSERT_EQ(gx[at], static_cast<float>(x[at] + o[at])) << "x row " << r << " column " << i;
        if (c.copy) {
          ASSERT_EQ(gc[static_cast<size_t>(r * copy_stride + i)], gx[at]) << "copy row " << r << " column " << i;
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(gc[static_cast<size_t>(r * copy_stride + i)]), 0xffffffffu)
              << "no copy asked, yet row " << r << " column " << i << " was written";
        }
      }
      const double inv = 1.0 / std::sqrt(ss / width + 1e-6);
      for (int i = 0; i < width; ++i) {
        const size_t at = static_cast<size_t>(r * width + i);
        const double want = w[static_cast<size_t>(i)] * v[static_cast<size_t>(i)] * inv;
        worst = std::max(worst, std::fabs(gy[at] - want));
        ASSERT_NEAR(gy[at], want, 1e-5 * (1.0 + std::fabs(want))) << "y row " << r << " column " << i;
      }
    }
    EXPECT_GT(worst, 0.0);  // f32 arithmetic, not a copy of the reference
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaQkvEpilogue,
                         ::testing::Values(EpilogueCase{1, 32, 8, 128, false, ck::kBF16, 1.0f, 1.0f},
                                           EpilogueCase{19, 16, 4, 64, true, ck::kBF16, 1.0f, 1.0f},
                                           EpilogueCase{7, 12, 2, 256, true, ck::kFp8E4m3, 0.5f, 2.0f},
                                           EpilogueCase{33, 8, 8, 80, false, ck::kFp8E4m3, 1.0f, 0.25f}),
                         [](const ::testing::TestParamInfo<EpilogueCase>& info) {
                           // e.g. n19_q16_kv4_hd64_norms_bf16_ks100_vs100 (scales in hundredths)
                           const EpilogueCase& c = info.param;
                           const std::string dtype = c.cache_dtype == ck::kBF16       ? "bf16"
                                                     : c.cache_dtype == ck::kFp8E4m3 ? "fp8"
                                                                                      : "dtype" + std::to_string(c.cache_dtype);
                           return "n" + std::to_string(c.n) + "_q" + std::to_string(c.num_q_heads) + "_kv" +
                                  std::to_string(c.num_kv_heads) + "_hd" + std::to_string(c.head_dim) +
                                  (c.norms ? "_norms_" : "_") + dtype + "_ks" + std::to_string(std::lround(c.k_scale * 100)) +
                                  "_vs" + std::to_string(std::lround(c.v_scale * 100));
                         });

}  // namespace
}  // namespace specula
