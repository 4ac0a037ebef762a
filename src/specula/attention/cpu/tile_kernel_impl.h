// The CPU attention kernel body, written as plain lane loops that the compiler vectorises. It is
// compiled once per instruction set: tile_kernel_generic.cpp (baseline x86-64 / any CPU) and
// tile_kernel_avx512.cpp (-mavx512*), each defining SPECULA_CPU_ISA_NS before including this.
//
// Layout inside one work item (W lanes = rows = query token x query head):
//   qt [head_dim][W]   queries, pre-multiplied by the softmax scale
//   kf [kTileKeys][head_dim], vf [kTileKeys][v_head_dim]   one K/V tile converted to f32
//   s  [kTileKeys][W]  scores, then probabilities of the tile
//   ot [v_head_dim][W] output accumulator
// Every inner loop runs over the W lanes, so there is no horizontal reduction anywhere.
#pragma once

#include <cstdint>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "specula/attention/cpu/tile_kernel.h"
#include "specula/core/error.h"

#ifndef SPECULA_CPU_ISA_NS
#error "define SPECULA_CPU_ISA_NS before including tile_kernel_impl.h"
#endif

namespace specula::SPECULA_CPU_ISA_NS {
namespace {

constexpr int kTileKeys = kCpuTileKeys;

// W floats as one value (GCC/Clang vector extension): each lane loop below is then exactly one
// vector instruction per step on AVX-512 (W = 16: one zmm; W = 8: one ymm) and a short sequence
// elsewhere, independent of how well the auto-vectoriser understands the loop nest.
template <int W>
struct LaneVec;
template <>
struct LaneVec<8> {
  typedef float type __attribute__((vector_size(32), aligned(4)));
};
template <>
struct LaneVec<16> {
  typedef float type __attribute__((vector_size(64), aligned(4)));
};

template <int W>
inline typename LaneVec<W>::type load_lanes(const float* p) {
  typename LaneVec<W>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <int W>
inline void store_lanes(float* p, typename LaneVec<W>::type v) {
  std::memcpy(p, &v, sizeof(v));
}
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) to ~2 ulp, branch-free so lane loops vectorise; exactly 0 for x < -87 (masked scores
// are -inf and must contribute exactly nothing).
// NaN propagates (a NaN score must show up in the output, as in the reference).
inline float fast_exp(float x) {
  const float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;  // NaN -> -87: no UB below
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  // Cody-Waite: ln2 split so n * kLn2Hi is exact.
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  const float result = x < -87.0f ? 0.0f : p * two_n;
  return x != x ? x : result;
}

// f16 -> f32 without branches: shifting the exponent/mantissa into float position and scaling
// by 2^112 is exact for normal and subnormal halves; inf/NaN are patched in.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const float magnitude = std::bit_cast<float>(em << 13) * 0x1p112f;
  const uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13);
  const uint32_t bits = em >= 0x7c00u ? special : std::bit_cast<uint32_t>(magnitude);
  return std::bit_cast<float>(bits | sign);
}

// fp8 e4m3fn -> f32, the same trick: exponent and mantissa move into float position and 2^120
// rebiases (exact for normals and subnormals); 0x7f/0xff are NaN.
inline float e4m3_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t em = b & 0x7fu;
  const float magnitude = std::bit_cast<float>(em << 20) * 0x1p120f;
  const uint32_t bits = em == 0x7fu ? 0x7fc00000u : std::bit_cast<uint32_t>(magnitude);
  return std::bit_cast<float>(bits | sign);
}

// Converts n contiguous cache elements to f32 times `descale`.
inline void load_row(const void* src, DType dtype, int n, float descale, float* dst) {
  switch (dtype) {
    case DType::f32: {
      const auto* s = static_cast<const float*>(src);
      for (int i = 0; i < n; ++i) dst[i] = s[i] * descale;
      return;
    }
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(static_cast<uint32_t>(s[i]) << 16) * descale;
      return;
    }
    case DType::f16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = half_to_float(s[i]) * descale;
      return;
    }
    case DType::fp8_e4m3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = e4m3_to_float(s[i]) * descale;
      return;
    }
    default: {
      for (int i = 0; i < n; ++i) dst[i] = load_as_float(src, dtype, static_cast<size_t>(i)) * descale;
      return;
    }
  }
}

template <int W>
void attend(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& item,
            CpuAttentionScratch& scratch) {
  const int D = p.head_dim;
  const int Dv = p.v_head_dim;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int rows = item.q_count * item.num_heads;

  // Preconditions the planner and run_cpu_attention establish.
  SPECULA_ASSERT(rows >= 1 && rows <= W);
  SPECULA_ASSERT(scratch.buffer.size() >= cpu_attention_scratch_floats(D, Dv, W));
  float* qt = scratch.buffer.data();
  float* kf = qt + D * W;
  float* vf = kf + kTileKeys * D;
  float* s = vf + kTileKeys * Dv;
  float* ot = s + kTileKeys * W;

  // Row r: query token q_begin + r / num_heads, query head kv_head * group + head_begin + r % num_heads.
  int pos[W];
  int head[W];
  int token[W];
  for (int r = 0; r < W; ++r) {
    const int rr = std::min(r, rows - 1);  // padding lanes mirror the last real row
    token[r] = seq.q_start + item.q_begin + rr / item.num_heads;
    head[r] = item.kv_head * group + item.head_begin + rr % item.num_heads;
    pos[r] = seq.q_kv_offset + item.q_begin + rr / item.num_heads;
  }
  for (int r = 0; r < W; ++r) {
    const size_t base = static_cast<size_t>(token[r] * p.q_stride_token + head[r] * p.q_stride_head);
    for (int d = 0; d < D; ++d) {
      qt[d * W + r] = r < rows ? load_as_float(p.q, p.q_dtype, base + static_cast<size_t>(d)) * p.scale : 0.0f;
    }
  }
  for (int i = 0; i < Dv * W; ++i) ot[i] = 0.0f;
  float m[W];
  float l[W];
  for (int r = 0; r < W; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
  }

  const int pos_min = seq.q_kv_offset + item.q_begin;
  const int pos_max = pos_min + item.q_count - 1;
  const bool custom = p.custom_mask != nullptr;
  const bool causal = p.causal && !custom;
  const int kv_end = causal ? std::min(seq.kv_len, pos_max + 1) : seq.kv_len;
  const int kv_begin = p.window_left >= 0 ? std::max(0, pos_min - p.window_left) : 0;
  // Keys in [full_lo, full_hi) are visible to every row: no per-element mask there.
  const int full_hi = causal ? pos_min + 1 : seq.kv_len;
  const int full_lo = p.window_left >= 0 ? pos_max - p.window_left : 0;
  const int64_t kv_row = static_cast<int64_t>(p.num_kv_heads);
  const char* k_base = static_cast<const char*>(p.k_cache);
  const char* v_base = static_cast<const char*>(p.v_cache);
  const size_t kv_elem = dtype_size(p.kv_dtype);

  for (int j0 = kv_begin; j0 < kv_end; j0 += kTileKeys) {
    const int n = std::min(kTileKeys, kv_end - j0);
    for (int jj = 0; jj < n; ++jj) {
      const int j = j0 + jj;
      const int64_t slot = static_cast<int64_t>(seq.pages[j / p.page_size]) * p.page_size + j % p.page_size;
      const int64_t row = slot * kv_row + item.kv_head;
      load_row(k_base + static_cast<size_t>(row * D) * kv_elem, p.kv_dtype, D, p.k_descale, kf + jj * D);
      load_row(v_base + static_cast<size_t>(row * Dv) * kv_elem, p.kv_dtype, Dv, p.v_descale, vf + jj * Dv);
      // Rows of one KV head are num_kv_heads rows apart and pages are scattered, so the hardware
      // prefetcher cannot see the stream: ask for the same key of the next tile now.
      const int ahead = j + kTileKeys;
      if (ahead < kv_end) {
        const int64_t slot_a = static_cast<int64_t>(seq.pages[ahead / p.page_size]) * p.page_size + ahead % p.page_size;
        const int64_t row_a = slot_a * kv_row + item.kv_head;
        const char* ka = k_base + static_cast<size_t>(row_a * D) * kv_elem;
        const char* va = v_base + static_cast<size_t>(row_a * Dv) * kv_elem;
        for (size_t off = 0; off < static_cast<size_t>(D) * kv_elem; off += 64) __builtin_prefetch(ka + off);
        for (size_t off = 0; off < static_cast<size_t>(Dv) * kv_elem; off += 64) __builtin_prefetch(va + off);
      }
    }

    // s[jj][:] = K[jj] . Q^T, four keys at a time so each qt row load feeds four FMAs.
    using V = typename LaneVec<W>::type;
    int jj = 0;
    for (; jj + 4 <= n; jj += 4) {
      V a0 = {}, a1 = {}, a2 = {}, a3 = {};
      const float* k0 = kf + jj * D;
      for (int d = 0; d < D; ++d) {
        const V q = load_lanes<W>(qt + d * W);
        a0 += k0[d] * q;
        a1 += k0[D + d] * q;
        a2 += k0[2 * D + d] * q;
        a3 += k0[3 * D + d] * q;
      }
      store_lanes<W>(s + jj * W, a0);
      store_lanes<W>(s + (jj + 1) * W, a1);
      store_lanes<W>(s + (jj + 2) * W, a2);
      store_lanes<W>(s + (jj + 3) * W, a3);
    }
    for (; jj < n; ++jj) {
      V a = {};
      const float* k = kf + jj * D;
      for (int d = 0; d < D; ++d) a += k[d] * load_lanes<W>(qt + d * W);
      store_lanes<W>(s + jj * W, a);
    }

    if (p.logit_cap > 0.0f) {
      const float cap = p.logit_cap;
      const float inv_cap = 1.0f / cap;
      for (int i = 0; i < n * W; ++i) s[i] = cap * std::tanh(s[i] * inv_cap);
    }
    if (!(j0 >= full_lo && j0 + n <= full_hi && !custom)) {
      for (int t = 0; t < n; ++t) {
        const int j = j0 + t;
        for (int r = 0; r < W; ++r) {
          bool visible = (!causal || j <= pos[r]) && (p.window_left < 0 || j >= pos[r] - p.window_left);
          if (custom) {
            const int64_t qi = pos[r] - seq.q_kv_offset;
            visible = visible && p.custom_mask[seq.mask_offset + qi * seq.kv_len + j] != 0;
          }
          if (!visible) s[t * W + r] = kNegInf;
        }
      }
    }

    // Online softmax update, lane by lane.
    float m_new[W];
    for (int w = 0; w < W; ++w) m_new[w] = m[w];
    for (int t = 0; t < n; ++t) {
      for (int w = 0; w < W; ++w) m_new[w] = std::max(m_new[w], s[t * W + w]);
    }
    float m_use[W];
    float alpha[W];
    for (int w = 0; w < W; ++w) {
      // A row that has seen only masked keys keeps max -inf; subtracting 0 instead avoids
      // -inf - -inf = NaN, and its probabilities stay exactly 0.
      m_use[w] = m_new[w] == kNegInf ? 0.0f : m_new[w];
      alpha[w] = fast_exp(m[w] - m_use[w]);
      m[w] = m_new[w];
    }
    for (int w = 0; w < W; ++w) l[w] *= alpha[w];
    for (int dv = 0; dv < Dv; ++dv) {
      for (int w = 0; w < W; ++w) ot[dv * W + w] *= alpha[w];
    }
    for (int t = 0; t < n; ++t) {
      for (int w = 0; w < W; ++w) {
        const float e = fast_exp(s[t * W + w] - m_use[w]);
        s[t * W + w] = e;
        l[w] += e;
      }
    }

    // ot[dv][:] += sum_t vf[t][dv] * s[t][:], four output columns at a time.
    int dv = 0;
    for (; dv + 4 <= Dv; dv += 4) {
      V o0 = load_lanes<W>(ot + dv * W), o1 = load_lanes<W>(ot + (dv + 1) * W);
      V o2 = load_lanes<W>(ot + (dv + 2) * W), o3 = load_lanes<W>(ot + (dv + 3) * W);
      for (int t = 0; t < n; ++t) {
        const V pr = load_lanes<W>(s + t * W);
        const float* v = vf + t * Dv + dv;
        o0 += v[0] * pr;
        o1 += v[1] * pr;
        o2 += v[2] * pr;
        o3 += v[3] * pr;
      }
      store_lanes<W>(ot + dv * W, o0);
      store_lanes<W>(ot + (dv + 1) * W, o1);
      store_lanes<W>(ot + (dv + 2) * W, o2);
      store_lanes<W>(ot + (dv + 3) * W, o3);
    }
    for (; dv < Dv; ++dv) {
      V o = load_lanes<W>(ot + dv * W);
      for (int t = 0; t < n; ++t) o += vf[t * Dv + dv] * load_lanes<W>(s + t * W);
      store_lanes<W>(ot + dv * W, o);
    }
  }

  // Normalise; a sink joins the denominator only.
  for (int r = 0; r < rows; ++r) {
    float m_final = m[r];
    float l_final = l[r];
    if (p.sinks != nullptr) {
      const float sink = p.sinks[head[r]];
      m_final = std::max(m[r], sink);
      l_final = (m[r] == kNegInf ? 0.0f : l[r] * std::exp(m[r] - m_final)) + std::exp(sink - m_final);
    }
    const float factor = l_final > 0.0f ? (m[r] == kNegInf ? 0.0f : std::exp(m[r] - m_final) / l_final) : 0.0f;
    const size_t base = static_cast<size_t>(token[r] * p.out_stride_token + head[r] * p.out_stride_head);
    for (int d = 0; d < Dv; ++d) {
      store_from_float(p.out, p.out_dtype, base + static_cast<size_t>(d), ot[d * W + r] * factor);
    }
    if (p.lse != nullptr) {
      p.lse[token[r] * p.lse_stride_token + head[r]] = l_final > 0.0f ? m_final + std::log(l_final) : kNegInf;
    }
  }
}

}  // namespace

void run_item(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& item, int lanes,
              CpuAttentionScratch& scratch) {
  if (lanes == 8) {
    attend<8>(p, seq, item, scratch);
  } else {
    attend<16>(p, seq, item, scratch);
  }
}

}  // namespace specula::SPECULA_CPU_ISA_NS
