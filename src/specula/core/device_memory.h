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

}  // namespace specula
