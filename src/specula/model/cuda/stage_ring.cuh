// The producer side of a grouped GEMM's ring of shared-memory stages (moe_gemm_wgmma.cu,
// moe_gemm_decode.cu). The weights do not depend on the previous kernel, so the first stages'
// weights go out before pdl_wait(); the rows (the previous kernel's output) only after it. Each
// later k tile waits for its stage to be released by the consumers, then reloads it.
#pragma once

#include <cstdint>

#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels {

template <int kStages, typename Weights, typename Rows>
__device__ __forceinline__ void fill_stage_ring(int k_tiles, uint64_t* empty, Weights&& weights,
                                                Rows&& rows) {
  const int first = k_tiles < kStages ? k_tiles : kStages;
  for (int kt = 0; kt < first; ++kt) weights(kt);
  pdl_wait();
  pdl_trigger();
  for (int kt = 0; kt < first; ++kt) rows(kt);
  for (int kt = kStages; kt < k_tiles; ++kt) {
    mbarrier_wait(&empty[kt % kStages], ((kt / kStages) - 1) & 1);
    weights(kt);
    rows(kt);
  }
}

}  // namespace specula::cuda_kernels
