// set_kv_buffer on the GPU: writes new tokens' K and V rows into a paged cache, converting to
// the cache dtype (fp8: divided by the layer's scale and saturated), round-to-nearest-even.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct SetKVParams {
  const void* k;        // [num_tokens, row_k] (row_k = num_kv_heads * head_dim), src dtype
  const void* v;        // [num_tokens, row_v]
  int64_t k_stride;     // elements between tokens in k
  int64_t v_stride;
  int32_t src_dtype;    // DTypeCode: f32, f16 or bf16
  void* k_cache;        // [num_slots, row_k], cache dtype
  void* v_cache;        // [num_slots, row_v]
  int32_t cache_dtype;  // DTypeCode: f32, f16, bf16 or fp8_e4m3
  const int32_t* loc;   // [num_tokens] destination slots
  int64_t num_tokens;
  int32_t row_k;
  int32_t row_v;
  float k_scale;        // fp8 only: stored = x / k_scale
  float v_scale;
};

void launch_set_kv_buffer(const SetKVParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
