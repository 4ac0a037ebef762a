// Element-wise kernels of the decoder on the GPU (f32 activations, raw pointers): embedding
// lookup, RMSNorm, biases, residual adds, the attention output's bf16 -> f32 conversion,
// soft-capping, row gathers, and the hi/lo bf16 split of activations. All run on the given
// stream, no sync.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// out[t, :] = table[ids[t], :] * scale
void embed_rows(const float* table, const int32_t* ids, float* out, int64_t n, int hidden, float scale, cudaStream_t s);
// The same from a bf16 table.
void embed_rows_bf16(const void* table, const int32_t* ids, float* out, int64_t n, int hidden, float scale, cudaStream_t s);
// x = hi + lo with hi = bf16(x) and lo = bf16(x - hi): two bf16 GEMMs on tensor cores then
// give the product with about 16 significant bits of x instead of bf16's 8.
void split_bf16(const float* x, void* hi, void* lo, int64_t count, cudaStream_t s);
// y[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps); y may alias x.
void rms_norm_rows(const float* x, const float* w, float* y, int64_t rows, int width, float eps, cudaStream_t s);
// y[r, :] += b
void add_bias_rows(float* y, const float* b, int64_t rows, int width, cudaStream_t s);
// y[r, c] = halves[r, c] + halves[rows + r, c] (+ b[c] when b is not null): the two terms of a
// product over stacked hi/lo rows.
void add_row_halves(const float* halves, const float* b, float* y, int64_t rows, int width, cudaStream_t s);
void add_inplace(float* x, const float* y, int64_t count, cudaStream_t s);
void bf16_to_f32(const void* x, float* y, int64_t count, cudaStream_t s);
void softcap(float* x, int64_t count, float cap, cudaStream_t s);
// out[i, :] = x[rows[i], :]
void gather_rows(const float* x, const int32_t* rows, float* out, int64_t count, int width, cudaStream_t s);

}  // namespace specula::cuda_kernels
