// DeviceVec: a device buffer of the CUDA MLA backend's step state (metadata, workspaces) that grows
// with the step (eager) or was sized once and must not grow (CUDA graphs).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/core/tensor.h"

namespace specula {

struct DeviceVec {
  Buffer buf;
  void ensure(DType dtype, int64_t n, Device device, bool fixed) {
    if (buf.data() != nullptr && buf.numel() >= n) return;
    SPECULA_CHECK(!fixed, "CUDA-graph MLA metadata needs {} entries but its buffer holds {}; "
                  "init_cuda_graph_state was given smaller limits", n, buf.numel());
    buf = Buffer(dtype, {std::max<int64_t>(n, 1)}, device);
  }
  template <typename T>
  void upload(const std::vector<T>& host, cudaStream_t stream) {
    if (host.empty()) return;
    // Pageable source: the copy is staged before the call returns, so host may change after.
    CUDA_CHECK(cudaMemcpyAsync(buf.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  template <typename T>
  T* get() const { return buf.data_as<T>(); }
};

}  // namespace specula
