// CUDA_CHECK: wraps every CUDA runtime call; a failure throws specula::Error naming the call,
// the error string and the place (device errors are not user input, but they must not crash the
// process: the caller may be serving other requests). Usable from .cu files (no fmt).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "specula/core/error_base.h"

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    const cudaError_t specula_cuda_status_ = (call);                                                      \
    SPECULA_REQUIRE(specula_cuda_status_ == cudaSuccess,                                                  \
                    std::string("CUDA error '") + cudaGetErrorString(specula_cuda_status_) + "' from " +  \
                        #call + " at " + __FILE__ + ":" + std::to_string(__LINE__));                      \
  } while (0)
