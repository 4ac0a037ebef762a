// merge_state: combines two partial attention results over disjoint key sets into the result
// over their union (the cascade / split-KV building block, FlashInfer's merge_state).
//   v_a, v_b, v_out: [num_tokens, num_heads, head_dim] (f32, bf16 or f16; v_out may alias v_a)
//   s_a, s_b, s_out: f32 [num_tokens, num_heads], natural-log sum-exp of each part's scores
// With m = max(s_a, s_b): v = (e^(s_a-m) v_a + e^(s_b-m) v_b) / (e^(s_a-m) + e^(s_b-m)) and
// s = m + log(e^(s_a-m) + e^(s_b-m)). An empty part has s = -inf and weight 0 (its v is
// ignored, even if NaN); when both are empty the output is 0 with s = -inf.
#pragma once

#include "specula/core/tensor.h"

namespace specula {

// All six on the CPU, or all on one CUDA device (runs on cuda_stream, a cudaStream_t).
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, void* cuda_stream = nullptr);

}  // namespace specula
