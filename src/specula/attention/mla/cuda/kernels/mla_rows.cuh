// What the MLA attention kernel (mla_attention.cu) does per query row: which keys a
// row may see, the masking of a tile's scores, and the normalised output (or f32 partials when
// the keys are split) with the LSE and attention sinks, which the split combine also folds in.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "specula/attention/cuda/kernels/convert.cuh"
#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"
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

// Sets to -inf the scores (an m64n64 accumulator) of the keys this thread's rows may not see:
// keys missing from the tile (bit k of `exists` clear) and, in dense steps, keys past a row's causal
// limit or draft tokens outside its tree. key0 is the tile's first key position.
__device__ __forceinline__ void mask_scores(float (&s)[8][4], uint64_t exists, const RowRules& rules, int key0) {
  const int t = threadIdx.x & 3;
  const bool per_row =
      rules.dense && (key0 + kKeys - 1 > rules.min_limit || (rules.tree && key0 + kKeys > rules.draft0));
  if (exists == ~0ull && !per_row) return;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
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

// Normalises and writes warpgroup wg's 256 columns of O for this thread's two rows (row sum l and
// maximum m in log2 units, over all the block's keys): f32 partials and a log2 LSE when the keys
// are split, else bf16 with the natural-log LSE and the sinks folded in.
__device__ __forceinline__ void write_rows(const MlaAttentionParams& p, const Item& it, int wg, int row_base,
                                           const float (&o)[32][4], const float (&l)[2], const float (&m)[2]) {
  using bf16 = __nv_bfloat16;
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row_in = row_base + 8 * r;
    if (row_in >= it.rows) continue;
    const int64_t row = it.row0 + row_in;
    const float lse2 = l[r] > 0.0f ? m[r] + log2f(l[r]) : kNegInf;
    float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    if (p.num_splits > 1) {
      const int64_t part_row = static_cast<int64_t>(it.split) * p.num_tokens * p.num_q_heads + row;
      float* dst = p.part_o + part_row * kMlaLoraRank + wg * 256;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      }
      if (t == 0 && wg == 0) p.part_lse[part_row] = lse2;
      continue;
    }
    float lse = lse2 * 0.6931471805599453f;
    fold_sink(p, row, lse, inv);
    auto* out = static_cast<bf16*>(p.out) + row * kMlaLoraRank + wg * 256;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) = pack2<bf16>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (p.lse != nullptr && t == 0 && wg == 0) p.lse[row] = lse;
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
