// merge_state on the GPU: combines two partial attention states (values + natural-log LSE) over
// disjoint key sets; the same definition and edge cases as attention/merge_state.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct MergeStateParams {
  const void* v_a;    // [num_rows, head_dim] (rows = tokens x heads), dtype below
  const float* s_a;   // [num_rows]
  const void* v_b;    // [num_rows, head_dim]
  const float* s_b;   // [num_rows]
  void* v_out;        // [num_rows, head_dim] (may alias v_a)
  float* s_out;       // [num_rows] (may alias s_a)
  int32_t dtype;      // DTypeCode: f32, f16 or bf16
  int64_t num_rows;
  int32_t head_dim;
};

void launch_merge_state(const MergeStateParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
