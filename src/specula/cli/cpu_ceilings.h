// The CPU's own ceilings, measured in the same run as a benchmark so its figures can be read
// as fractions of what this machine can do: memory bandwidth (a large copy, bytes read plus
// written, over all threads) and f32 matrix-multiply rate (OpenBLAS sgemm).
#pragma once

namespace specula {

class ThreadPool;

struct CpuCeilings {
  double copy_gbps = 0;    // GB/s, read + written
  double sgemm_gflops = 0; // GFLOP/s
};

CpuCeilings measure_cpu_ceilings(ThreadPool& pool);

}  // namespace specula
