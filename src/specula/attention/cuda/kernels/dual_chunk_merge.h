// The last step of dual chunk attention's prefill on the GPU: the passes' partial results (f32,
// each over its own keys, with its natural-log LSE) merged into the layer's output, as merge_state
// merges two (an empty pass, LSE -inf, weighs nothing even where its values are NaN).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct DualChunkMergeParams {
  const float* parts;      // [num_parts][num_tokens, num_heads, head_dim], dense
  const float* part_lse;   // [num_parts][num_tokens, num_heads]
  int32_t num_parts;       // 1 to 3
  void* out;               // [num_tokens, num_heads, head_dim] with the strides below, io dtype
  int64_t out_stride_token;
  int64_t out_stride_head;
  int32_t io_dtype;        // DTypeCode: kBF16 or kF16
  float* lse;              // [num_tokens, num_heads] with lse_stride_token, or nullptr
  int64_t lse_stride_token;
  int64_t num_tokens;
  int32_t num_heads;
  int32_t head_dim;
};

void launch_dual_chunk_merge(const DualChunkMergeParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
