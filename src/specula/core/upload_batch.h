// UploadBatch: many small host-to-device copies of one step as one copy and one kernel. Each
// cudaMemcpyAsync costs the host a few microseconds and the stream a DMA of its own between
// kernels; a step's metadata is a dozen arrays of a few hundred bytes. add() packs each array
// into one host staging area; flush() copies the area to a device staging buffer and scatters it
// to the destinations with one kernel (a block per destination), in stream order. Arrays over
// kDirectBytes keep a copy of their own: one block would move them slower than a DMA does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "specula/core/tensor.h"

namespace specula {

class UploadBatch {
 public:
  explicit UploadBatch(Device device) : device_(device) {}
  // dst[0, bytes) = src[0, bytes) at the next flush; src is read now.
  void add(void* dst, const void* src, size_t bytes);
  template <typename T>
  void add(T* dst, const std::vector<T>& src) {
    add(dst, src.data(), src.size() * sizeof(T));
  }
  // Queues the copies on s (nothing when none were added) and starts an empty batch. The device
  // staging buffer is reused by the next flush, in order on the same stream.
  void flush(cudaStream_t s);
  // Drops what was added since the last flush.
  void clear() {
    host_.clear();
    direct_host_.clear();
    entries_.clear();
    direct_.clear();
  }

 private:
  static constexpr size_t kDirectBytes = 64 * 1024;
  struct Entry {
    void* dst;
    size_t offset, bytes;
  };
  Device device_;
  std::vector<unsigned char> host_;         // the packed arrays, each at a 16-byte offset
  std::vector<unsigned char> direct_host_;  // the arrays copied on their own
  std::vector<Entry> entries_, direct_;
  Buffer staging_;
};

}  // namespace specula
