// Timing GPU work with CUDA events: the median over repetitions, after warm-up.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "specula/core/cuda_check.h"

namespace specula {

// Median seconds per call of fn(), each timed alone on the legacy default stream.
template <typename Fn>
double cuda_median_seconds(const Fn& fn, int reps, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    fn();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e-3);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace specula
