// device_memory.h over the CUDA runtime.
#include <cuda_runtime_api.h>

#include <mutex>
#include <utility>
#include <vector>

#include "specula/core/cuda_check.h"
#include "specula/core/device_memory.h"
#include "specula/core/error.h"

namespace specula {

namespace {
void select(Device device) {
  SPECULA_CHECK(device.is_cuda(), "expected a CUDA device, got {}", device.str());
  const int count = cuda_device_count();
  SPECULA_CHECK(device.index < count, "device {} is not present; this machine has {} CUDA device(s)",
                device.str(), count);
  CUDA_CHECK(cudaSetDevice(device.index));
}
}  // namespace

void* device_malloc(size_t bytes, Device device) {
  select(device);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  SPECULA_CHECK(status == cudaSuccess, "out of memory on {} allocating {} bytes ({})", device.str(),
                bytes, cudaGetErrorString(status));
  return p;
}

namespace {
// The deferred frees (device_memory.h): pointers with their device, or -1 for pinned host memory.
struct Deferred {
  std::mutex mutex;
  int depth = 0;
  std::vector<std::pair<void*, int>> queued;
};
Deferred& deferred() {
  static Deferred d;
  return d;
}
// Queues ptr when frees are deferred; false when the caller should free it now.
bool queue_free(void* ptr, int device) {
  Deferred& d = deferred();
  std::lock_guard<std::mutex> hold(d.mutex);
  if (d.depth == 0) return false;
  d.queued.emplace_back(ptr, device);
  return true;
}
void free_now(void* ptr, int device) {
  if (device < 0) {
    cudaFreeHost(ptr);
    return;
  }
  int current = 0;
  cudaGetDevice(&current);
  cudaSetDevice(device);
  cudaFree(ptr);
  cudaSetDevice(current);
}
}  // namespace

void device_free(void* ptr, Device device) {
  // Called from destructors: never throws; a failure here means the context is already gone.
  if (ptr == nullptr || queue_free(ptr, device.index)) return;
  cudaSetDevice(device.index);
  cudaFree(ptr);
}

void free_pinned_host(void* ptr) {
  if (ptr == nullptr || queue_free(ptr, -1)) return;
  cudaFreeHost(ptr);
}

void begin_deferred_frees() {
  Deferred& d = deferred();
  std::lock_guard<std::mutex> hold(d.mutex);
  ++d.depth;
}

void end_deferred_frees() {
  std::vector<std::pair<void*, int>> now;
  {
    Deferred& d = deferred();
    std::lock_guard<std::mutex> hold(d.mutex);
    if (--d.depth > 0) return;
    now.swap(d.queued);
  }
  for (const auto& [ptr, device] : now) free_now(ptr, device);
}

void device_memset_zero(void* ptr, size_t bytes, Device device) {
  select(device);
  CUDA_CHECK(cudaMemset(ptr, 0, bytes));
}

void device_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device.is_cuda()) select(dst_device); else select(src_device);
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace specula
