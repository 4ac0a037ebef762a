// Device memory primitives behind Buffer and copy(). With CUDA off they throw specula::Error
// ("this build has no CUDA"), so CPU-only builds fail clearly instead of crashing.
#pragma once

#include <cstddef>

#include "specula/core/device.h"

namespace specula {

void* device_malloc(size_t bytes, Device device);
void device_free(void* ptr, Device device);
void device_memset_zero(void* ptr, size_t bytes, Device device);
// Copies bytes between any two of host and CUDA devices (synchronous).
void device_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
int cuda_device_count();
// Frees pinned host memory (cudaMallocHost), or queues it while frees are deferred.
void free_pinned_host(void* ptr);

// Tensor parallelism: between begin_deferred_frees and the matching end_deferred_frees (a count:
// they nest), device_free and free_pinned_host only queue their pointers, and the last end frees
// them. cudaFree and cudaFreeHost wait for the work of every peer GPU, which may be a collective
// waiting for this very thread's next launch: the deadlock NCCL's and PyTorch's notes describe.
// So ranks free only between steps, when none of them has a collective in flight.
void begin_deferred_frees();
void end_deferred_frees();

// Scope of begin/end_deferred_frees.
class DeferredFrees {
 public:
  DeferredFrees() { begin_deferred_frees(); }
  ~DeferredFrees() { end_deferred_frees(); }
  DeferredFrees(const DeferredFrees&) = delete;
  DeferredFrees& operator=(const DeferredFrees&) = delete;
};

}  // namespace specula
