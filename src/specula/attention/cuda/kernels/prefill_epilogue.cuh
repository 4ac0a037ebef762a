// The end of a prefill work item, shared by both prefill kernels (mma.sync and warpgroup MMA):
// output rows in mma.sync's C fragment layout (mma.cuh) are normalised by their quad's sum, a
// sink joins the denominator only, and each row is stored with its LSE.
#pragma once

#include <cstdint>

#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/io.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"

namespace specula::cuda_kernels {

// The thread's rows are row_base and row_base + 8 of the item (rows_valid of them exist), held
// as elements 2 rr, 2 rr + 1 of o's tiles with running max m (log2 units) and this thread's
// share of the sum l; t is the thread's index in its quad, first_token the item's first row.
template <int D>
__device__ __forceinline__ void store_prefill_rows(const AttentionParams& p, const float (&o)[D / 8][4],
                                                   const float (&m)[2], const float (&l)[2], int row_base,
                                                   int rows_valid, int t, int head, int64_t first_token) {
  constexpr float kNegInf = -__builtin_huge_valf();
  const int32_t out_dtype = p.out_f32 ? kF32 : p.io_dtype;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float sum = l[rr];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = row_base + 8 * rr;
    if (r >= rows_valid) continue;
    const float lse = sum > 0.0f ? m[rr] * kLn2 + logf(sum) : kNegInf;
    float out_scale = 1.0f;
    const float total = p.sinks != nullptr ? join_sink(lse, p.sinks[head], out_scale) : lse;
    const float factor = sum > 0.0f ? out_scale / sum * p.v_descale : 0.0f;
    const int64_t token = first_token + r;
    const int64_t base = token * p.out_stride_token + static_cast<int64_t>(head) * p.out_stride_head;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      store_io(p.out, out_dtype, base + col, o[nt][2 * rr] * factor);
      store_io(p.out, out_dtype, base + col + 1, o[nt][2 * rr + 1] * factor);
    }
    if (p.lse != nullptr && t == 0) p.lse[token * p.lse_stride_token + head] = total;
  }
}

}  // namespace specula::cuda_kernels
