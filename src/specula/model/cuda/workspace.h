// CudaWorkspace: the activation buffers of a GPU model step, by slot. An eager workspace grows
// with the batch; a CUDA-graph workspace is sized by the largest captured batch and then frozen,
// so captured kernels keep valid pointers (growing a frozen slot is an error naming it).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "specula/core/error.h"
#include "specula/core/tensor.h"

namespace specula {

template <size_t kSlots>
struct CudaWorkspace {
  std::array<Buffer, kSlots> slots;
  bool frozen = false;

  // Slot `slot` holding at least `elements` values of dtype on device.
  Buffer& get(size_t slot, DType dtype, int64_t elements, Device device) {
    SPECULA_ASSERT(slot < kSlots);
    Buffer& b = slots[slot];
    if (b.data() == nullptr || b.dtype() != dtype || b.numel() < elements) {
      SPECULA_CHECK(!frozen, "CUDA-graph workspace slot {} holds {} elements; {} are needed", slot, b.numel(), elements);
      b = Buffer(dtype, {std::max<int64_t>(elements, 1)}, device);
    }
    return b;
  }
};

}  // namespace specula
