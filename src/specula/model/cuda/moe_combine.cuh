// The sums of moe_combine (moe_kernels.h), shared by its own kernel and by the small tile's down
// product that ends in it: one order of additions for both, so both give the same bits.
#pragma once

#include <cstdint>

#include "specula/model/cuda/moe_kernels.h"

namespace specula::cuda_kernels {

// order[i], i < top_k: token t's pairs by expert index (the order the CPU adds its experts in).
// Thread `tid` < top_k places its own pair by its rank; call from top_k threads at least, then
// synchronise.
__device__ __forceinline__ void moe_combine_order(const MoeCombineParams& p, int64_t t, int* order, int tid) {
  if (tid >= p.top_k) return;
  const int32_t* ids = p.ids + t * p.top_k;
  const int32_t mine = ids[tid];
  int rank = 0;
  for (int j = 0; j < p.top_k; ++j) rank += ids[j] < mine || (ids[j] == mine && j < tid);
  order[rank] = tid;
}

// out[t, c] before it is stored. y is read through L2 (ld.cg): in the down product other blocks
// wrote it during the same launch, and L1 is not coherent across multiprocessors.
__device__ __forceinline__ float moe_combine_column(const MoeCombineParams& p, int64_t t, int c, const int* order) {
  float acc = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    const int64_t pair = t * p.top_k + order[j];
    const float y = __ldcg(p.y + static_cast<int64_t>(__ldcg(p.slot + pair)) * p.hidden + c);
    acc = __fadd_rn(acc, __fmul_rn(__ldcg(p.weights + pair), y));
  }
  return acc;
}

}  // namespace specula::cuda_kernels
