// `specula bench moe`: the GPU mixture-of-experts layer (CudaMoe) on real model shapes
// (DeepSeek-V2-Lite, Qwen3-30B-A3B; random weights). Decode batches: the layer's time and the
// bytes it must read (the selected experts, the shared ones, the router) against the read rate
// of that many bytes measured in the same run. Prefill: the grouped GEMMs' FLOP rate against a
// cuBLAS bf16 GEMM of the same FLOPs (as if every token went to one expert) in the same run.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_moe_command(CLI::App& bench);

}  // namespace specula
