// Tensor maps for TMA (tma.cuh) over 16-bit tensors, in the layout of the wgmma operand tiles:
// boxes 64 elements wide (128 bytes) with the 128-byte swizzle.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace specula::cuda_kernels {

// A map of a `rank`-dimensional tensor of 16-bit elements (bf16 when `bf16`, else f16): `dims`
// innermost first, `strides` in bytes for dims 1 .. rank - 1, `box` per dim with box[0] = 64.
// Reads outside the tensor land as zeros. `what` names the tensor in the error when encoding fails.
CUtensorMap swizzled_tensor_map(const void* base, bool bf16, int rank, const uint64_t* dims, const uint64_t* strides,
                                const uint32_t* box, const char* what);

}  // namespace specula::cuda_kernels
