// DeviceArray: a device array of a backend's step state (metadata, split workspaces, pass buffers).
// It grows on demand, dropping its contents; once frozen (the buffers a CUDA graph captured) it
// never moves, and a step that needs more is refused with a clear error.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "specula/core/cuda_check.h"
#include "specula/core/dtype.h"
#include "specula/core/error.h"
#include "specula/core/tensor.h"
#include "specula/core/upload_batch.h"

namespace specula {

// The Buffer dtype that holds T: the dtype only sizes and labels the storage.
template <typename T>
constexpr DType device_array_dtype() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::f32;
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    return DType::bf16;
  } else {
    static_assert(std::is_integral_v<T> && (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8),
                  "DeviceArray holds float, bf16_t or 1-, 4- or 8-byte integers");
    return sizeof(T) == 1 ? DType::u8 : sizeof(T) == 4 ? DType::i32 : DType::i64;
  }
}

template <typename T>
class DeviceArray {
 public:
  T* data() const { return buffer_.data_as<T>(); }

  // At least n entries (at least one is always allocated).
  void reserve(int64_t n, Device device) {
    if (n <= capacity_ && buffer_.data() != nullptr) return;
    SPECULA_CHECK(!frozen_, "CUDA-graph step state needs {} entries but was sized for {} at init_cuda_graph_state", n,
                  capacity_);
    capacity_ = std::max<int64_t>(n, 1);
    buffer_ = Buffer(device_array_dtype<T>(), {capacity_}, device);
  }

  // Like reserve; newly allocated entries are zero (ordered on `stream`).
  void reserve_zeroed(int64_t n, Device device, cudaStream_t stream) {
    const T* before = data();
    reserve(n, device);
    if (data() != before) CUDA_CHECK(cudaMemsetAsync(data(), 0, static_cast<size_t>(capacity_) * sizeof(T), stream));
  }

  // host's values land in the array at the batch's flush.
  void upload(const std::vector<T>& host, Device device, UploadBatch& batch) {
    reserve(static_cast<int64_t>(host.size()), device);
    if (!host.empty()) batch.add(data(), host);
  }

  // The first n entries as a tensor.
  TensorView view(int64_t n) const { return buffer_.view().slice(0, n); }

  void freeze() { frozen_ = true; }

 private:
  Buffer buffer_;
  int64_t capacity_ = 0;
  bool frozen_ = false;
};

}  // namespace specula
