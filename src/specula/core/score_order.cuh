// The order of (score, index) pairs that every GPU selection shares with the CPU's (BetterScore):
// the larger score first, the lower index on equal scores. A NaN score never comes first, so a
// selection that starts from -inf never picks one.
#pragma once

#include <cstdint>

namespace specula::cuda_kernels {

__device__ __forceinline__ bool score_before(float va, int32_t ia, float vb, int32_t ib) {
  return va != vb ? va > vb : ia < ib;
}

}  // namespace specula::cuda_kernels
