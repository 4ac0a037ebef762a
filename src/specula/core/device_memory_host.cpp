// device_memory.h for builds without CUDA: every device request is a clear error.
#include "specula/core/device_memory.h"
#include "specula/core/error.h"

namespace specula {

namespace {
[[noreturn]] void no_cuda(Device device) {
  SPECULA_CHECK(false, "device {} was requested, but this build of specula has no CUDA "
                "(configure with nvcc available and -DSPECULA_CUDA=ON)", device.str());
  __builtin_unreachable();
}
}  // namespace

void* device_malloc(size_t, Device device) { no_cuda(device); }
void device_free(void*, Device) {}
void device_memset_zero(void*, size_t, Device device) { no_cuda(device); }
void device_memcpy(void*, Device dst_device, const void*, Device src_device, size_t) {
  no_cuda(dst_device.is_cuda() ? dst_device : src_device);
}
int cuda_device_count() { return 0; }
void free_pinned_host(void*) {}
void begin_deferred_frees() {}
void end_deferred_frees() {}
bool cuda_available() { return false; }

}  // namespace specula
