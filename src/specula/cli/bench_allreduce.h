// `specula bench allreduce`: tensor parallelism's all-reduce over the GPUs of this machine, the
// one-shot peer path against NCCL on the same messages (f32, 4 KiB to 256 MiB), eager and inside
// CUDA graphs: microseconds per call, and bus bandwidth (2 (n - 1) / n x bytes / time, NCCL's
// measure) next to the GPU-to-GPU copy rate measured in the same run.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_allreduce_command(CLI::App& bench);

}  // namespace specula
