// What the MLA attention kernel (mla_attention.cu) does per query row: which keys a
// row may see, the masking of a tile's scores, and the normalised output (or f32 partials when
// the keys are split) with the LSE and attention sinks, which the split combine also folds in.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "specula/core/convert.cuh"
#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"
#include "specula/attention/cuda/kernels/tma.cuh"
#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/attention/mla/cuda/kernels/mla_items.cuh"
#include "specula/attention/mla/cuda/kernels/mla_stages.cuh"

namespace specula::cuda_kernels::mla {

constexpr float kNegInf = -__builtin_huge_valf();

// Which keys the rows of this thread may see beyond the tile's existence bits (dense steps: the
// causal limit of the row's token and, for tree verification, its draft-token bits).
struct RowRules {
  int limit[2];
  uint64_t bits[2];
  int min_limit;  // the block's smallest limit: tiles wholly below it need no per-row mask
  int draft0;     // first draft-token key position (tree steps)
  bool tree;
  bool dense;
};

__device__ __forceinline__ RowRules row_rules(const MlaAttentionParams& p, const Item& it, int row_base) {
  RowRules rr{};
  rr.dense = p.slots == nullptr;
  rr.tree = rr.dense && p.tree_bits != nullptr;
  rr.min_limit = INT32_MAX;
  rr.draft0 = INT32_MAX;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    rr.limit[i] = INT32_MAX;
    rr.bits[i] = ~0ull;
  }
  if (!rr.dense) return rr;
  const int H = p.num_q_heads;
  const int first = p.first_token[it.unit];
  rr.draft0 = it.kv_len - it.q_len;
  rr.min_limit = rr.draft0 + static_cast<int>(it.row0 / H) - first;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row_base + 8 * i;
    if (r >= it.rows) continue;  // its scores are never written
    const int token = static_cast<int>((it.row0 + r) / H);
    rr.limit[i] = rr.draft0 + token - first;
    if (rr.tree) rr.bits[i] = p.tree_bits[token];
  }
  return rr;
}

// Sets to -inf the scores (an m64 x 8J accumulator: the tile's first 8J keys) of the keys this
// thread's rows may not see: keys missing from the tile (bit k of `exists` clear) and, in dense
// steps, keys past a row's causal limit or draft tokens outside its tree. key0 is the tile's first
// key position.
template <int J>
__device__ __forceinline__ void mask_scores(float (&s)[J][4], uint64_t exists, const RowRules& rules, int key0) {
  const int t = threadIdx.x & 3;
  const bool per_row =
      rules.dense && (key0 + kKeys - 1 > rules.min_limit || (rules.tree && key0 + kKeys > rules.draft0));
  if (exists == ~0ull && !per_row) return;
#pragma unroll
  for (int j = 0; j < J; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = 8 * j + 2 * t + (e & 1);
      const int r = e >> 1;
      bool visible = (exists >> key) & 1ull;
      if (per_row) {
        const int pos = key0 + key;
        visible = visible && pos <= rules.limit[r] &&
                  (pos < rules.draft0 || !rules.tree || ((rules.bits[r] >> (pos - rules.draft0)) & 1ull));
      }
      if (!visible) s[j][e] = kNegInf;
    }
  }
}

// Folds row `row`'s attention sink (a natural-log logit that takes probability mass but adds no
// value) into its natural-log LSE and the factor that normalises its output.
__device__ __forceinline__ void fold_sink(const MlaAttentionParams& p, int64_t row, float& lse, float& inv) {
  if (p.sinks == nullptr) return;
  float sink_scale;
  lse = join_sink(lse, p.sinks[row % p.num_q_heads], sink_scale);
  inv *= sink_scale;
}

// A whole block of 64 normalised bf16 rows leaves through shared memory (the Q region, dead by
// then): each warp stores its 16 rows' 256 columns there with stmatrix, in the 128-byte swizzle of
// 64 x 64 boxes, and one thread per warpgroup stores its four boxes by TMA (`out_map`: out as
// [rows, 512] bf16). Measured on the H200 (dense bf16 h128 L4096), a block's epilogue took 6-7.5 us
// with direct stores, all blocks of a wave storing at once, and 3 us with one 512-byte bulk copy
// per row, which the compiler issues one lane at a time.
static_assert(2 * kHalfBlocks * kBlockBytes <= kTileBytes, "the staged rows fit in Q's region");

// Whether the step's output goes out by TMA (out_map encoded): unsplit, and out 16-byte aligned.
__host__ __device__ __forceinline__ bool tma_output(const MlaAttentionParams& p) {
  return p.num_splits <= 1 && (reinterpret_cast<uintptr_t>(p.out) & 15u) == 0;
}

// Normalises and writes warpgroup wg's 256 columns of O for this thread's two rows (row sum l and
// maximum m in log2 units, over all the block's keys): f32 partials and a log2 LSE when the keys
// are split, else bf16 with the natural-log LSE and the sinks folded in: a whole block by TMA through
// `staging` when out_map is given (tma_output), else by direct stores.
__device__ __forceinline__ void write_rows(const MlaAttentionParams& p, const Item& it, int wg, int row_base,
                                           const float (&o)[32][4], const float (&l)[2], const float (&m)[2],
                                           const CUtensorMap* out_map, uint8_t* staging) {
  using bf16 = __nv_bfloat16;
  const int t = threadIdx.x & 3;
  const bool split = p.num_splits > 1;
  float lse[2], inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse[r] = l[r] > 0.0f ? m[r] + log2f(l[r]) : kNegInf;
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    if (!split) {
      lse[r] *= 0.6931471805599453f;
      fold_sink(p, it.row0 + row_base + 8 * r, lse[r], inv[r]);
    }
    if (t == 0 && wg == 0 && row_base + 8 * r < it.rows) {
      const int64_t row = it.row0 + row_base + 8 * r;
      if (split) {
        p.part_lse[static_cast<int64_t>(it.split) * p.num_tokens * p.num_q_heads + row] = lse[r];
      } else if (p.lse != nullptr) {
        p.lse[row] = lse[r];
      }
    }
  }
  if (out_map != nullptr && it.rows == kRows) {
    const int lane = threadIdx.x & 31;
    const int row = (row_base & ~15) + 8 * ((lane >> 3) & 1) + (lane & 7);  // warp w: rows 16 w .. + 15
    // Matrix j of a stmatrix: rows 8 (j & 1) .. + 7 of the warp's, columns of chunk n + (j >> 1).
#pragma unroll
    for (int n = 0; n < 32; n += 2) {
      const uint32_t frag[4] = {pack2<bf16>(o[n][0] * inv[0], o[n][1] * inv[0]),
                                pack2<bf16>(o[n][2] * inv[1], o[n][3] * inv[1]),
                                pack2<bf16>(o[n + 1][0] * inv[0], o[n + 1][1] * inv[0]),
                                pack2<bf16>(o[n + 1][2] * inv[1], o[n + 1][3] * inv[1])};
      stmatrix_x4(frag, staging + swizzled_offset(kRows, row, wg * 256 + (n + (lane >> 4)) * 8));
    }
    fence_proxy_async();
    named_barrier_sync(kBarOut + wg, 128);
    if ((threadIdx.x & 127) == 0) {
#pragma unroll
      for (int b = 0; b < kHalfBlocks; ++b) {
        tma_store_2d(out_map, staging + (wg * kHalfBlocks + b) * kBlockBytes, wg * 256 + b * 64,
                     static_cast<int>(it.row0));
      }
      bulk_commit();
      bulk_wait_read();
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row_in = row_base + 8 * r;
    if (row_in >= it.rows) continue;
    const int64_t row = it.row0 + row_in;
    if (split) {
      float* dst = p.part_o + (static_cast<int64_t>(it.split) * p.num_tokens * p.num_q_heads + row) * kMlaLoraRank +
                   wg * 256;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) = make_float2(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]);
      }
    } else {
      auto* out = static_cast<bf16*>(p.out) + row * kMlaLoraRank + wg * 256;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) =
            pack2<bf16>(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]);
      }
    }
  }
}

// Q's 64 rows x 576 into shared memory as nine swizzled column blocks (rows past the block's are
// zero), by every thread of the first `threads`, visible to wgmma once they pass a barrier.
__device__ __forceinline__ void load_q(const MlaAttentionParams& p, const Item& it, uint8_t* dst, int threads) {
  const auto* q = static_cast<const uint8_t*>(p.q);
  for (int c = threadIdx.x; c < kRows * kBlocks * 8; c += threads) {
    const int row = c / (kBlocks * 8);
    const int chunk = c % (kBlocks * 8);
    const bool ok = row < it.rows;
    const uint8_t* src = q + (ok ? (it.row0 + row) * (kBlocks * 128) + chunk * 16 : 0);
    cp_async_16(dst + swizzled_offset(kRows, row, chunk * 8), src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
}

}  // namespace specula::cuda_kernels::mla
