// The gated MLP's activation, shared by the element-wise kernel (fused_ops.cu) and the GEMV's
// gated epilogue (gemv.cu) so both give the same bits.
#pragma once

namespace specula::cuda_kernels {

// silu(g) or gelu_tanh(g), to be multiplied by the up projection.
__device__ __forceinline__ float gate_activation(float g, bool gelu) {
  return gelu ? 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) : g / (1.0f + expf(-g));
}

}  // namespace specula::cuda_kernels
