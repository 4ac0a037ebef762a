// CUDA_CHECK: wraps every CUDA runtime call; a failure throws specula::Error naming the call,
// the error string and the place (device errors are not user input, but they must not crash the
// process: the caller may be serving other requests).
#pragma once

#include <cuda_runtime_api.h>

#include "specula/core/error.h"

#define CUDA_CHECK(call)                                                                    \
  do {                                                                                      \
    const cudaError_t specula_cuda_status_ = (call);                                        \
    SPECULA_CHECK(specula_cuda_status_ == cudaSuccess, "CUDA error '{}' from {} at {}:{}",  \
                  cudaGetErrorString(specula_cuda_status_), #call, __FILE__, __LINE__);     \
  } while (0)
