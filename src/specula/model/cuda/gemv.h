// Skinny matrix products for decode: y[r, o] = sum_i x[r, i] * w[o, i] for a few rows r of f32
// activations against bf16 weights, accumulated in f32 (bf16 -> f32 is exact, so this is the f32
// product of the stored weights). Bandwidth-bound: each weight is read once, in 16-byte loads
// that bypass L1 so the activations stay cached there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

inline constexpr int kGemvMaxRows = 8;

// w: bf16 [out, in] row-major, 16-byte aligned; x: f32 [rows, in]; y: f32 [rows, out].
// Requires 1 <= rows <= kGemvMaxRows and in % 8 == 0.
void gemv_bf16(const void* w, const float* x, float* y, int rows, int in, int out, cudaStream_t s);
// The same with bf16 activations x [rows, in] (attention's output feeds o_proj without a copy).
void gemv_bf16_xbf16(const void* w, const void* x, float* y, int rows, int in, int out, cudaStream_t s);
// The gated MLP's first product and its activation in one launch: w stacks the gate rows over the
// up rows ([2 inter, in]); y [rows, inter] = act(x gate^T) * (x up^T), act silu or gelu_tanh. The
// same bits as gemv_bf16 followed by gated_activation_fused wherever both launches give a feature
// group the same number of warps (gemv.cu's split_rows).
void gemv_bf16_gated(const void* w, const float* x, float* y, int rows, int in, int inter, bool gelu, cudaStream_t s);

}  // namespace specula::cuda_kernels
