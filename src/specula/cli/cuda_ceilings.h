// The GPU's own ceilings, measured in the same run as a benchmark: device-to-device copy
// bandwidth (bytes read plus written) and the bf16 cuBLAS GEMM rate, each the median of several
// timed repetitions after a warm-up, on random data.
#pragma once

#include "specula/core/device.h"

namespace specula {

struct CudaCeilings {
  double copy_tbps = 0;       // TB/s, read + written
  double gemm_tflops = 0;     // bf16 in, f32 accumulate
  const char* device_name = "";
};

CudaCeilings measure_cuda_ceilings(Device device);

}  // namespace specula
