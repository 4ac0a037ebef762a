// Timing GPU work with CUDA events: the median over repetitions, after warm-up.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/core/l2_flush.h"

namespace specula {

// The L2's state when a timed call starts. cold: a read over twice the L2 came first, so the
// call's data is gone and the L2 holds clean lines, as a layer finds it after the other layers'
// weight reads. dirty: a write over twice the L2 came first (Triton's do_bench flush): the call's
// misses also pay for writing back the flush's dirty lines (H200, B=1 L=32768 decode, 134 MB
// read: 27 MB of DRAM writes during the kernel against 13 MB after a read, by ncu; 58% of the
// copy rate against 69%). warm: nothing in between (the previous call's last bytes still hit).
enum class L2Start { cold, dirty, warm };

// Parses "cold", "dirty" or "warm".
inline L2Start parse_l2_start(const std::string& name) {
  if (name == "cold") return L2Start::cold;
  if (name == "dirty") return L2Start::dirty;
  SPECULA_CHECK(name == "warm", "--l2 {}: allowed cold, dirty, warm", name);
  return L2Start::warm;
}

// Median seconds per call of fn(), each timed alone on the legacy default stream, starting from
// the given L2 state. The flush is queued before the start event, so the GPU is still busy with
// it while the host queues the event and the call: the host's launch latency does not land
// between the two events (with warm, it can).
template <typename Fn>
double cuda_median_seconds(const Fn& fn, int reps, int warmup = 2, L2Start l2 = L2Start::cold) {
  int device = 0, l2_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const size_t flush_bytes = std::max<size_t>(2 * static_cast<size_t>(l2_bytes), size_t{64} << 20);
  void* flush = nullptr;
  CUDA_CHECK(cudaMalloc(&flush, flush_bytes + 16));
  CUDA_CHECK(cudaMemset(flush, 0x5a, flush_bytes + 16));
  unsigned* sink = reinterpret_cast<unsigned*>(static_cast<unsigned char*>(flush) + flush_bytes);
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    if (l2 == L2Start::cold) cuda_kernels::read_through_l2(flush, flush_bytes, sink, nullptr);
    if (l2 == L2Start::dirty) CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes));
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
