// The CPU decode kernel for bf16 and e4m3 KV on processors with AVX512-BF16 (compiled with
// -mavx512bf16; chosen at run time, see tile_kernel.cpp): one query token per work item, every
// query head of a KV head's group against each K/V row in its row-major bf16 form. An e4m3 cache's
// rows are turned into bf16 once per tile (exactly: every e4m3 value is a bf16 value); its
// per-layer K scale is folded into the query and its V scale into the output.
//
// Q.K: `vdpbf16ps` multiplies 32 bf16 pairs into 16 f32 lanes per instruction. The query (f32,
// scaled) is split into three bf16 terms hi + mid + lo that hold all 24 bits of its mantissa, and
// a bf16 K element times a bf16 term is exact in f32, so the score is an f32 dot product summed in
// another order, not a bf16 one. The 16 lanes of each (head, key) sum are folded at the end of a
// tile, 16 keys at once.
// P.V: each V row is widened to f32 once and added into every head's output with FMAs.
// The softmax is online over tiles of 16 keys, as in tile_kernel_impl.h, with a vector exp.
#include "specula/attention/cpu/decode_kernel.h"

#include "specula/core/error.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace specula::cpu_avx512bf16 {
namespace {

constexpr int kKeys = 16;  // keys per tile: one score vector per head
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for 16 lanes: the same range reduction and polynomial as tile_kernel_impl.h's fast_exp
// (~2 ulp); exactly 0 below -87 (masked scores are -inf), NaN passes through.
__m512 exp16(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 shifter = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 poly = _mm512_set1_ps(1.0f / 5040.0f);
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 720.0f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 120.0f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 24.0f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 6.0f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.5f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 result = _mm512_mul_ps(poly, _mm512_castsi512_ps(e));
  result = _mm512_mask_mov_ps(result, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_mov_ps(result, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// Lane t of the result: the sum of the 16 lanes of v[t]. A transposed reduction: each step adds
// pairs of vectors after shuffling them so that every vector holds half as many lanes per key;
// after four steps lane t holds key t's whole sum.
__m512 fold16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {
    a[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {
    b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x88), _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

__m512bh load_bf16x32(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// Sixteen bf16 values widened to f32 (exact).
__m512 widen16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e4m3 ("fn": no infinities, 0x7f and 0xff are NaN) codes in 16-bit lanes -> their bf16 bits,
// exactly: every e4m3 value is a bf16 value. Normal codes move their exponent (bias 7 -> 127) and
// mantissa (3 bits -> the top of 7); the subnormals m x 2^-9 come from a table.
__m512i e4m3_lanes_to_bf16(__m512i x) {
  const __m512i e = _mm512_and_si512(_mm512_srli_epi16(x, 3), _mm512_set1_epi16(0xF));
  const __m512i m = _mm512_and_si512(x, _mm512_set1_epi16(7));
  const __m512i normal = _mm512_or_si512(_mm512_slli_epi16(_mm512_add_epi16(e, _mm512_set1_epi16(120)), 7),
                                         _mm512_slli_epi16(m, 4));
  const __m512i subnormals = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                              0x3C60, 0x3C40, 0x3C20, 0x3C00, 0x3BC0, 0x3B80, 0x3B00, 0);
  __m512i bits = _mm512_mask_mov_epi16(normal, _mm512_cmpeq_epi16_mask(e, _mm512_setzero_si512()),
                                       _mm512_permutexvar_epi16(m, subnormals));
  const __m512i magnitude = _mm512_and_si512(x, _mm512_set1_epi16(0x7F));
  bits = _mm512_mask_mov_epi16(bits, _mm512_cmpeq_epi16_mask(magnitude, _mm512_set1_epi16(0x7F)),
                               _mm512_set1_epi16(0x7FC0));
  return _mm512_or_si512(bits, _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8));
}

// n e4m3 codes (n a multiple of 16) -> bf16, once per row of a tile, so that every query head
// of the group reads the row in the bf16 kernel's form.
void e4m3_row_to_bf16(const uint8_t* src, int n, uint16_t* dst) {
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, e4m3_lanes_to_bf16(_mm512_cvtepu8_epi16(b)));
  }
  if (i < n) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m512i bf = e4m3_lanes_to_bf16(_mm512_cvtepu8_epi16(_mm256_zextsi128_si256(b)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_castsi512_si256(bf));
  }
}

}  // namespace

bool decode_supported(const CpuAttentionParams& p) {
  return (p.kv_dtype == DType::bf16 || p.kv_dtype == DType::fp8_e4m3) && p.custom_mask == nullptr &&
         p.head_dim % 32 == 0 && p.v_head_dim % 16 == 0;
}

namespace {

// E: the cache's element, uint16_t (bf16) or uint8_t (e4m3, with the layer's descales: K's
// folded into the query, V's into the output).
template <typename E>
void decode_item_as(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& item,
                    CpuAttentionScratch& scratch, float* partials) {
  const int D = p.head_dim;
  const int Dv = p.v_head_dim;
  const int G = item.num_heads;
  const int group = p.num_q_heads / p.num_kv_heads;
  SPECULA_ASSERT(item.q_count == 1 && G >= 1 && G <= kMaxDecodeHeads);
  SPECULA_ASSERT(scratch.buffer.size() >= decode_scratch_floats(D, Dv, G));
  // Scratch: the query terms (3 x G x D bf16) and a row of D zeros (bf16), the output
  // accumulators (G x Dv f32) and the tile's probabilities (G x 16 f32).
  auto* qterms = reinterpret_cast<uint16_t*>(scratch.buffer.data());
  uint16_t* zeros = qterms + 3 * G * D;
  float* out = scratch.buffer.data() + static_cast<size_t>((3 * G + 1) * D + 1) / 2;
  float* s = out + G * Dv;
  std::fill(zeros, zeros + D, uint16_t{0});

  const int token = seq.q_start + item.q_begin;
  const int pos = seq.q_kv_offset + item.q_begin;
  const int head0 = item.kv_head * group + item.head_begin;
  for (int g = 0; g < G; ++g) {
    const size_t base = static_cast<size_t>(token * p.q_stride_token + (head0 + g) * p.q_stride_head);
    for (int d = 0; d < D; ++d) {
      // hi + mid + lo: each term the bf16 rounding of what the previous ones left.
      float rest = load_as_float(p.q, p.q_dtype, base + static_cast<size_t>(d)) * (p.scale * p.k_descale);
      for (int t = 0; t < 3; ++t) {
        float term = 0.0f;
        if (std::isnan(rest)) {
          term = t == 0 ? std::bit_cast<float>(0x7fc00000u) : 0.0f;  // a NaN stays a NaN in bf16
        } else if (std::isinf(rest)) {
          term = t == 0 ? rest : 0.0f;
        } else {
          // Round to nearest even; a value so large that it would round to infinity is cut
          // instead, so the terms stay finite.
          const uint32_t bits = std::bit_cast<uint32_t>(rest);
          const float rounded = std::bit_cast<float>((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
          term = std::isinf(rounded) ? std::bit_cast<float>(bits & 0xffff0000u) : rounded;
        }
        qterms[(t * G + g) * D + d] = static_cast<uint16_t>(std::bit_cast<uint32_t>(term) >> 16);
        rest = std::isfinite(rest) ? rest - term : 0.0f;
      }
    }
  }
  std::fill(out, out + G * Dv, 0.0f);
  float m[kMaxDecodeHeads], l[kMaxDecodeHeads];
  std::fill(m, m + G, kNegInf);
  std::fill(l, l + G, 0.0f);

  const int kv_end = std::min(p.causal ? std::min(seq.kv_len, pos + 1) : seq.kv_len, item.key_end);
  const int kv_begin = std::max(p.window_left >= 0 ? std::max(0, pos - p.window_left) : 0, item.key_begin);
  const int64_t kv_row = p.num_kv_heads;
  const auto* k_base = static_cast<const E*>(p.k_cache);
  const auto* v_base = static_cast<const E*>(p.v_cache);
  // The tile's K and V rows as bf16: in the cache, or (e4m3) converted into ktile / vtile.
  const uint16_t* krow[kKeys];
  const uint16_t* vrow[kKeys];
  uint16_t* ktile = reinterpret_cast<uint16_t*>(s + G * kKeys);
  uint16_t* vtile = ktile + kKeys * D;
  // Elements per 64-byte line.
  constexpr int kLine = 64 / static_cast<int>(sizeof(E));

  for (int j0 = kv_begin; j0 < kv_end; j0 += kKeys) {
    const int n = std::min(kKeys, kv_end - j0);
    for (int t = 0; t < n; ++t) {
      const int j = j0 + t;
      const int64_t slot = static_cast<int64_t>(seq.pages[j / p.page_size]) * p.page_size + j % p.page_size;
      const int64_t row = slot * kv_row + item.kv_head;
      if constexpr (std::is_same_v<E, uint16_t>) {
        krow[t] = k_base + row * D;
        vrow[t] = v_base + row * Dv;
      } else {
        e4m3_row_to_bf16(k_base + row * D, D, ktile + t * D);
        e4m3_row_to_bf16(v_base + row * Dv, Dv, vtile + t * Dv);
        krow[t] = ktile + t * D;
        vrow[t] = vtile + t * Dv;
      }
      // Rows of one KV head lie num_kv_heads rows apart on scattered pages: the hardware
      // prefetcher cannot follow, so ask for the same key of the next tile, into L2 only
      // (prefetching into L1 evicted rows still in use: 16 sequences of 2048 keys read 16.0-16.5
      // GB/s so and 18.5-18.8 into L2, back to back on the 2-core VM).
      const int ahead = j + kKeys;
      if (ahead < kv_end) {
        const int64_t slot_a = static_cast<int64_t>(seq.pages[ahead / p.page_size]) * p.page_size + ahead % p.page_size;
        const int64_t row_a = slot_a * kv_row + item.kv_head;
        for (int off = 0; off < D; off += kLine) __builtin_prefetch(k_base + row_a * D + off, 0, 2);
        for (int off = 0; off < Dv; off += kLine) __builtin_prefetch(v_base + row_a * Dv + off, 0, 2);
      }
    }

    // Keys past n read a row of zeros (their scores are masked below), so the key loop has a
    // fixed length and its 16 accumulators stay in registers.
    for (int t = n; t < kKeys; ++t) krow[t] = zeros;
    const __mmask16 live = static_cast<__mmask16>((1u << n) - 1u);
    for (int g = 0; g < G; ++g) {
      __m512 acc[kKeys];
      for (int t = 0; t < kKeys; ++t) acc[t] = _mm512_setzero_ps();
      for (int c = 0; c < D; c += 32) {
        const __m512bh q0 = load_bf16x32(qterms + g * D + c);
        const __m512bh q1 = load_bf16x32(qterms + (G + g) * D + c);
        const __m512bh q2 = load_bf16x32(qterms + (2 * G + g) * D + c);
        for (int t = 0; t < kKeys; ++t) {
          const __m512bh k = load_bf16x32(krow[t] + c);
          acc[t] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[t], q0, k), q1, k), q2, k);
        }
      }
      __m512 sc = fold16(acc);
      if (p.logit_cap > 0.0f) {
        alignas(64) float tmp[kKeys];
        _mm512_store_ps(tmp, sc);
        for (int t = 0; t < kKeys; ++t) tmp[t] = p.logit_cap * std::tanh(tmp[t] / p.logit_cap);
        sc = _mm512_load_ps(tmp);
      }
      sc = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), live, sc);
      const float tile_max = _mm512_reduce_max_ps(sc);
      const float m_new = std::max(m[g], tile_max);
      // Only masked keys so far: subtract 0 so that -inf - -inf never makes a NaN.
      const float m_use = m_new == kNegInf ? 0.0f : m_new;
      const float alpha = m[g] == kNegInf ? 0.0f : std::exp(m[g] - m_use);
      m[g] = m_new;
      const __m512 e = exp16(_mm512_sub_ps(sc, _mm512_set1_ps(m_use)));
      l[g] = l[g] * alpha + _mm512_reduce_add_ps(e);
      _mm512_storeu_ps(s + g * kKeys, e);
      if (alpha != 1.0f) {
        const __m512 a = _mm512_set1_ps(alpha);
        for (int c = 0; c < Dv; c += 16) _mm512_storeu_ps(out + g * Dv + c, _mm512_mul_ps(_mm512_loadu_ps(out + g * Dv + c), a));
      }
    }

    // out[g] += sum_t s[g][t] * V[t]: 64 output columns of four heads held in 16 registers, so
    // each V piece is widened once and each probability broadcast once per 64 columns.
    for (int c0 = 0; c0 < Dv; c0 += 64) {
      const int cn = std::min(64, Dv - c0) / 16;
      for (int g0 = 0; g0 < G; g0 += 4) {
        const int gn = std::min(4, G - g0);
        __m512 o[4][4];
        for (int g = 0; g < gn; ++g) {
          for (int c = 0; c < cn; ++c) o[g][c] = _mm512_loadu_ps(out + (g0 + g) * Dv + c0 + 16 * c);
        }
        for (int t = 0; t < n; ++t) {
          __m512 v[4];
          for (int c = 0; c < cn; ++c) v[c] = widen16(vrow[t] + c0 + 16 * c);
          for (int g = 0; g < gn; ++g) {
            const __m512 w = _mm512_set1_ps(s[(g0 + g) * kKeys + t]);
            for (int c = 0; c < cn; ++c) o[g][c] = _mm512_fmadd_ps(w, v[c], o[g][c]);
          }
        }
        for (int g = 0; g < gn; ++g) {
          for (int c = 0; c < cn; ++c) _mm512_storeu_ps(out + (g0 + g) * Dv + c0 + 16 * c, o[g][c]);
        }
      }
    }
  }

  if (item.partial >= 0) {
    // A chunk of the keys: its own softmax and log-sum-exp; decode_split merges the chunks (and
    // adds a sink there).
    float* slot = partials + item.partial;
    for (int g = 0; g < G; ++g) {
      const float inv = l[g] > 0.0f ? p.v_descale / l[g] : 0.0f;
      for (int d = 0; d < Dv; ++d) slot[g * Dv + d] = out[g * Dv + d] * inv;
      slot[G * Dv + g] = l[g] > 0.0f ? m[g] + std::log(l[g]) : kNegInf;
    }
    return;
  }
  // Normalise; a sink joins the denominator only (as tile_kernel_impl.h).
  for (int g = 0; g < G; ++g) {
    const int head = head0 + g;
    float m_final = m[g];
    float l_final = l[g];
    if (p.sinks != nullptr) {
      const float sink = p.sinks[head];
      m_final = std::max(m[g], sink);
      l_final = (m[g] == kNegInf ? 0.0f : l[g] * std::exp(m[g] - m_final)) + std::exp(sink - m_final);
    }
    const float factor =
        l_final > 0.0f ? (m[g] == kNegInf ? 0.0f : p.v_descale * std::exp(m[g] - m_final) / l_final) : 0.0f;
    const size_t base = static_cast<size_t>(token * p.out_stride_token + head * p.out_stride_head);
    for (int d = 0; d < Dv; ++d) store_from_float(p.out, p.out_dtype, base + static_cast<size_t>(d), out[g * Dv + d] * factor);
    if (p.lse != nullptr) {
      p.lse[token * p.lse_stride_token + head] = l_final > 0.0f ? m_final + std::log(l_final) : kNegInf;
    }
  }
}

}  // namespace

void decode_item(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& item,
                 CpuAttentionScratch& scratch, float* partials) {
  if (p.kv_dtype == DType::fp8_e4m3) {
    decode_item_as<uint8_t>(p, seq, item, scratch, partials);
  } else {
    decode_item_as<uint16_t>(p, seq, item, scratch, partials);
  }
}

}  // namespace specula::cpu_avx512bf16

#else

// Built without AVX512-BF16 (not x86-64): the kernel is never chosen.
namespace specula::cpu_avx512bf16 {
bool decode_supported(const CpuAttentionParams&) { return false; }
void decode_item(const CpuAttentionParams&, const CpuAttentionSeq&, const CpuWorkItem&, CpuAttentionScratch&, float*) {
  SPECULA_ASSERT(false, "the bf16 decode kernel was called in a build without AVX512-BF16");
}
}  // namespace specula::cpu_avx512bf16

#endif
