// The GPU's own ceilings, measured in the same run as a benchmark: device-to-device copy
// bandwidth (bytes read plus written) and the bf16 cuBLAS GEMM rate, each the median of several
// timed repetitions after a warm-up, on random data.
#pragma once

#include <cstddef>
#include <string>

#include "specula/core/device.h"
#include "specula/core/tensor.h"

namespace specula {

struct CudaCeilings {
  double copy_tbps = 0;       // TB/s, read + written
  double gemm_tflops = 0;     // bf16 in, f32 accumulate
  const char* device_name = "";
};

CudaCeilings measure_cuda_ceilings(Device device);

// Standard normal bf16 values in b (a 4M-value block drawn once and repeated: data for timing).
void fill_random_bf16(const Buffer& b, uint64_t seed);

// TB/s at which a streaming kernel (4 blocks of 512 threads per multiprocessor) reads `bytes` once,
// timed as a benchmark case is, from the given L2 state ("cold", "dirty", "warm"): the ceiling of a
// call that has that many bytes to read. A short read stays below the copy rate, whose 2 GiB
// amortise the ramp of a kernel's first and last microseconds (H200, cold L2: 134 MB at 91-92% of it).
double measure_cuda_read_tbps(Device device, size_t bytes, const std::string& l2);

}  // namespace specula
