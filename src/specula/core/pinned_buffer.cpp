// PinnedBuffer: cudaMallocHost / cudaFreeHost.
#include "specula/core/pinned_buffer.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "specula/core/cuda_check.h"
#include "specula/core/device_memory.h"

namespace specula {

PinnedBuffer::~PinnedBuffer() { free_pinned_host(data_); }

void* PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  free_pinned_host(data_);
  data_ = nullptr;
  capacity_ = std::max<size_t>(bytes, 4096);
  CUDA_CHECK(cudaMallocHost(&data_, capacity_));
  return data_;
}

}  // namespace specula
