// Online-softmax update of one query row held in mma.sync fragments (mma.cuh's C layout): the
// thread holds elements 2 rr and 2 rr + 1 of every 8-column tile of row g + 8 rr, and the four
// lanes of a quad share the row. Scores times `scale` (> 0) are in log2 units; they become
// probabilities in place, and the running max m (log2 units), this thread's share of the sum l
// and the output fragments are rescaled. Folding the scale in here costs one FFMA per score.
#pragma once

namespace specula::cuda_kernels {

// 2^x on the MUFU alone. exp2f is ex2.approx.f32 without ftz, which sm_90 wraps in a range test and
// two multiplies so that subnormal results survive; a probability below 2^-126 changes no f32
// softmax sum, so flushing it to 0 saves three instructions per score. -inf gives 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Pairwise reduction of v[0..W) into v[0] (W need not be a power of two): a chain of log2(W)
// dependent steps instead of W - 1, which matters where one warp per scheduler runs the softmax.
// Recursion on W keeps every index a constant, so v stays in registers.
template <int W, int N, class Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
  if constexpr (W > 1) {
    constexpr int kHalf = (W + 1) / 2;
#pragma unroll
    for (int i = 0; i < W / 2; ++i) v[i] = op(v[i], v[i + kHalf]);
    return tree_reduce<kHalf>(v, op);
  } else {
    return v[0];
  }
}

template <int N, class Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
  return tree_reduce<N, N>(v, op);
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

template <int kScoreTiles, int kOutTiles>
__device__ __forceinline__ void online_softmax_row(float (&s)[kScoreTiles][4], int rr, float scale, float& m, float& l,
                                                   float (&o)[kOutTiles][4]) {
  constexpr float kNegInf = -__builtin_huge_valf();
  // Four running partials: short dependent chains without holding a partial per tile (head_dim
  // 256 tiles have no registers to spare).
  constexpr int kParts = kScoreTiles < 4 ? kScoreTiles : 4;
  float part[kParts];
#pragma unroll
  for (int nt = 0; nt < kScoreTiles; ++nt) {
    const float v = fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]);
    part[nt % kParts] = nt < kParts ? v : fmaxf(part[nt % kParts], v);
  }
  float mx = tree_reduce(part, MaxOp{});
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx = fmaxf(m, mx * scale);
  // A row that has seen nothing keeps max -inf; subtracting 0 keeps its terms at 0.
  const float m_use = mx == kNegInf ? 0.0f : mx;
  const float alpha = exp2_ftz(m - m_use);
  m = mx;
  l *= alpha;
#pragma unroll
  for (int nt = 0; nt < kOutTiles; ++nt) {
    o[nt][2 * rr] *= alpha;
    o[nt][2 * rr + 1] *= alpha;
  }
#pragma unroll
  for (int nt = 0; nt < kScoreTiles; ++nt) {
    s[nt][2 * rr] = exp2_ftz(fmaf(s[nt][2 * rr], scale, -m_use));
    s[nt][2 * rr + 1] = exp2_ftz(fmaf(s[nt][2 * rr + 1], scale, -m_use));
    const float v = s[nt][2 * rr] + s[nt][2 * rr + 1];
    part[nt % kParts] = nt < kParts ? v : part[nt % kParts] + v;
  }
  l += tree_reduce(part, AddOp{});
}

// The same update for a transposed tile, S^T = K Q^T in one m16n8k16 C fragment: the thread
// holds keys g and g + 8 of queries 2t and 2t + 1 (c0, c2 and c1, c3), and the eight lanes of
// equal t share the queries. Scores are in log2 units; m and l are per query (2t, 2t + 1), l
// this thread's share; o[j][e] belongs to query 2t + (e & 1).
template <int kOutTiles>
__device__ __forceinline__ void online_softmax_cols(float (&s)[4], float (&m)[2], float (&l)[2],
                                                    float (&o)[kOutTiles][4]) {
  constexpr float kNegInf = -__builtin_huge_valf();
  float mx[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) mx[e] = fmaxf(s[e], s[2 + e]);
#pragma unroll
  for (int lanes = 4; lanes < 32; lanes *= 2) {
#pragma unroll
    for (int e = 0; e < 2; ++e) mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], lanes));
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float m_new = fmaxf(m[e], mx[e]);
    const float m_use = m_new == kNegInf ? 0.0f : m_new;
    const float alpha = exp2_ftz(m[e] - m_use);
    m[e] = m_new;
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j) {
      o[j][e] *= alpha;
      o[j][2 + e] *= alpha;
    }
    s[e] = exp2_ftz(s[e] - m_use);
    s[2 + e] = exp2_ftz(s[2 + e] - m_use);
    l[e] = l[e] * alpha + s[e] + s[2 + e];
  }
}

// An attention sink joins the softmax denominator only. Given a row's natural-log LSE over its
// keys, returns the LSE with the sink and sets out_scale, the factor the sink leaves on the
// output (0 when no key was visible).
__device__ __forceinline__ float join_sink(float lse, float sink, float& out_scale) {
  constexpr float kNegInf = -__builtin_huge_valf();
  const float mm = fmaxf(lse, sink);
  const float total = mm + logf((lse == kNegInf ? 0.0f : expf(lse - mm)) + expf(sink - mm));
  out_scale = lse == kNegInf ? 0.0f : expf(lse - total);
  return total;
}

}  // namespace specula::cuda_kernels
