// The kernels of tp_greedy_combine (parallel/tp_greedy.h), C++17 for nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// slots [size][rows][2] (zeroed by the caller): this rank's (value, global id) pairs, -inf and -1 where a
// row has no token.
void tp_greedy_fill(const int32_t* ids, const float* values, int64_t rows, int rank, int size, int64_t vocab_begin,
                    float* slots, cudaStream_t s);
// ids, values [rows]: the best pair of each row over the ranks (the lower rank on ties).
void tp_greedy_pick(const float* slots, int64_t rows, int size, int32_t* ids, float* values, cudaStream_t s);

}  // namespace specula::cuda_kernels
