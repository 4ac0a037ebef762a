// EAGLE-3's attention input in one launch (a draft step otherwise spends six launches on it:
// embedding, a copy of the residual, two RMSNorms and two strided copies).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// a[t] = [input_norm(embed[ids[t]]) ; hidden_norm(x[t])] ([n, 2 * hidden]); when x_out is given,
// x_out[t] = x[t] too (the residual stream the layer then updates in place). embed: [vocab,
// hidden], bf16 when embed_bf16 else f32.
void eagle3_attention_input(const void* embed, bool embed_bf16, const int32_t* ids, const float* x,
                            const float* input_norm, const float* hidden_norm, float* a, float* x_out, int64_t n,
                            int hidden, float eps, cudaStream_t s);

}  // namespace specula::cuda_kernels
