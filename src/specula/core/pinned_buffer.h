// PinnedBuffer: page-locked host memory that grows on demand (CUDA builds only). Copies between
// it and the device are truly asynchronous and skip the driver's staging copy: a small
// device-to-host copy from pageable memory costs about 10 us of host time, from pinned memory a
// few. Used for the per-step downloads of the GPU decoders.
#pragma once

#include <cstddef>

namespace specula {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` of pinned memory; the old contents are lost when it grows.
  void* reserve(size_t bytes);
  const void* data() const { return data_; }
  template <typename T>
  T* reserve_as(size_t count) {
    return static_cast<T*>(reserve(count * sizeof(T)));
  }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace specula
