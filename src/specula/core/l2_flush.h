// A streaming read (benchmarks only). Over a buffer larger than the L2 it evicts the L2 before a
// timed call and leaves it full of clean lines, as a decode step's weight reads leave it for the
// next layer; timed over a case's bytes it is that case's read ceiling (cli/cuda_ceilings.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace specula::cuda_kernels {

// Reads bytes (a multiple of 16) from src; writes sink[0] only if the data's XOR is a value the
// caller never stores, which keeps the loads from being removed.
void read_through_l2(const void* src, size_t bytes, unsigned* sink, cudaStream_t s);

}  // namespace specula::cuda_kernels
