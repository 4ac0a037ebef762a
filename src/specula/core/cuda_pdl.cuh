// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may be scheduled
// while the kernel before it in the stream is still finishing, so its launch latency (and any
// work that does not depend on that kernel, such as streaming weights) overlaps the other's
// tail. Such a kernel must call pdl_wait() before it reads anything the previous kernel writes or
// writes anything an earlier kernel reads; pdl_wait() returns once the previous kernel has
// completed and its writes are visible. pdl_trigger() lets the next kernel be scheduled early.
// Every kernel calls pdl_trigger() only after its own pdl_wait(), so when a kernel starts, all
// kernels before the previous one have completed: what only they wrote (step metadata, KV rows
// of earlier steps) may be read before pdl_wait() (the decode kernel's first copies do). Keep that
// order in new kernels. Kernels launched the ordinary way treat both as no-ops, and stream capture
// turns the relaxed ordering into programmatic edges of the CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "specula/core/cuda_check.h"

namespace specula {

// launch_pdl always asks for the relaxed ordering, so device code built for an architecture
// without griddepcontrol would run unordered: refuse to build it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "specula's kernels use programmatic dependent launch and need sm_90 or newer (CMAKE_CUDA_ARCHITECTURES)"
#endif

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace specula
