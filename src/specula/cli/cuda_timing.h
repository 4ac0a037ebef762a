// Timing GPU work with CUDA events: the median over repetitions, after warm-up.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "specula/core/cuda_check.h"

namespace specula {

// Median seconds per call of fn(), each timed alone on the legacy default stream. Before each
// call an untimed write over twice the L2 is queued, so every call starts with a cold cache (as
// a layer does after the previous layer's weights went through the L2) and the GPU is still busy
// with that write while the host queues the start event and the call: the host's launch latency
// does not land between the two events. The write leaves dirty
// lines that the timed call's misses evict, as a previous layer's writes would (Triton's
// do_bench flushes the same way).
template <typename Fn>
double cuda_median_seconds(const Fn& fn, int reps, int warmup = 2) {
  int device = 0, l2_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const size_t flush_bytes = std::max<size_t>(2 * static_cast<size_t>(l2_bytes), size_t{64} << 20);
  void* flush = nullptr;
  CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes));
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
  CUDA_CHECK(cudaFree(flush));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace specula
