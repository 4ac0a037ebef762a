// `specula bench linear`: the decode products of one Llama-3-8B layer (q|k|v, o_proj, gated
// gate|up, down_proj: 436 MB of bf16 weights) and its lm_head (1.05 GB) for a few activation rows,
// through each of CudaLinear's kernels (the GEMV, and cuBLAS's GEMM over the stacked hi/lo split
// with its split and add passes): milliseconds per call from a cold L2, and the weights' read rate
// next to the copy and read ceilings measured in the same run. What CudaLinear::kGemvFastRows is
// set from.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_linear_command(CLI::App& bench);

}  // namespace specula
