// Tensor-core products for a few activation rows (speculative verify, small decode batches):
// y[r, o] = sum_i x[r, i] * w[o, i] with bf16 weights, f32 accumulation. Memory-bound like the
// GEMV (each weight read once), but the multiply-adds run on the tensor cores with the weights as
// the 16-row operand and the activations as the 8-column one, so rows cost almost nothing until
// the weights stop being the bottleneck. f32 activations are split into bf16 hi + lo terms in
// registers (no scratch, no extra pass), which keeps about 16 bits of each activation as cuBLAS's
// GEMM over a hi/lo split does, without that path's split and add kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

inline constexpr int kSkinnyMaxRows = 32;

// Whether the kernel takes a product of `in` inputs (a multiple of 64).
inline bool skinny_fits(int in) { return in > 0 && in % 64 == 0; }

// Products with too few weight rows to fill the GPU split their inputs over several blocks; the
// last block of a group to finish adds the groups' partial sums in a fixed order (so results do
// not depend on timing). Per stream: `partial` f32 values and `counters` zeroed once (the last
// block leaves its counter at zero again).
struct SkinnyScratch {
  float* partial = nullptr;
  unsigned* counters = nullptr;
  int multiprocessors = 0;  // of the GPU the scratch is on
};
// What a SkinnyScratch needs on a GPU with `multiprocessors` SMs.
int64_t skinny_partial_floats(int multiprocessors);
int skinny_counters(int multiprocessors);

// w: bf16 [out, in] row-major, 16-byte aligned; x: f32 [rows, in]; y: f32 [rows, out].
// Requires 1 <= rows <= kSkinnyMaxRows and skinny_fits(in).
void skinny_gemm(const void* w, const float* x, float* y, int rows, int in, int out, SkinnyScratch scratch,
                 cudaStream_t s);
// The same with bf16 activations (one term, no split).
void skinny_gemm_xbf16(const void* w, const void* x, float* y, int rows, int in, int out, SkinnyScratch scratch,
                       cudaStream_t s);
// The gated MLP's first product: w stacks gate rows over up rows ([2 inter, in]);
// y [rows, inter] = act(x gate^T) * (x up^T), act silu or gelu_tanh.
void skinny_gemm_gated(const void* w, const float* x, float* y, int rows, int in, int inter, bool gelu,
                       SkinnyScratch scratch, cudaStream_t s);

}  // namespace specula::cuda_kernels
