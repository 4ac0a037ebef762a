// Greedy tokens on the GPU: each row's argmax over f32 logits, so a greedy step downloads one id
// per row instead of the vocabulary's logits and the host does not scan them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// out[r] = the lowest index of the largest value of row r of x [rows, width], NaN counting as
// -inf, or -1 when the row holds no value above -inf: the host's greedy_token (runner/sampler.h).
// Rows are read with 16-byte loads when x is 16-byte aligned and width a multiple of 4.
// allowed (optional, device): only the tokens it allows count, ceil(width / 32) words per row,
// token j of a row at bit j % 32 of its word j / 32 (structured output's masks).
// values (optional, device): each row's largest value (-inf for -1).
void argmax_rows(const float* x, int64_t rows, int width, int32_t* out, cudaStream_t s,
                 const uint32_t* allowed = nullptr, float* values = nullptr);

}  // namespace specula::cuda_kernels
