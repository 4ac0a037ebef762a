// Raising a kernel's dynamic shared-memory limit, once per kernel and device.
// cudaFuncSetAttribute changes the current device's context only: a kernel raised on GPU 0 keeps
// the default 48 KiB limit on GPU 1, where a launch asking for more fails with "invalid argument".
// Under tensor parallelism each rank's thread drives its own GPU, so a process-wide "done once"
// flag would leave every GPU but the first unraised.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "specula/core/cuda_check.h"

namespace specula {

// Sets cudaFuncAttributeMaxDynamicSharedMemorySize to `bytes` for `kernel` on the current device
// the first time this thread launches it there (later calls are a lookup). Callers pass the most
// the kernel ever asks for, so one call per device suffices.
template <typename Kernel>
void raise_dynamic_smem(Kernel* kernel, size_t bytes) {
  thread_local std::vector<std::pair<const void*, int>> raised;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
  for (const auto& k : raised) {
    if (k == key) return;
  }
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  raised.push_back(key);
}

}  // namespace specula
