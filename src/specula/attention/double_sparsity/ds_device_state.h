// DoubleSparsityBackend's GPU state (internal to double_sparsity/): the channel tables, each
// step's slots, page table and lengths, and the sparse decode's workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <vector>

#include "specula/attention/double_sparsity/ds_backend.h"
#include "specula/attention/double_sparsity/ds_kernels.h"
#include "specula/core/device_array.h"

namespace specula {

struct DoubleSparsityBackend::DeviceState {
  explicit DeviceState(Device d);

  // Once per step: the slots written (out_cache_loc) and, for a sparse decode, the page table and
  // KV lengths.
  void upload_step(const ForwardBatch& batch, const PageTable* table, const std::vector<int32_t>& kv_lens, void* stream);
  // Labels of this step's slots, gathered from the pool's K on the device.
  void write_labels(const AttentionLayer& layer, const DoubleSparsityConfig& config, const MHAKVPool& pool,
                    const TensorView& labels, const ForwardBatch& batch, void* stream);
  TensorView slots_view(const ForwardBatch& batch, void* stream);
  const int32_t* channels(const DoubleSparsityConfig& config, int layer, void* stream);
  const float* sinks(const AttentionLayer& layer, void* stream);

  Device device;
  int num_sms = 0;
  UploadBatch uploads;
  int64_t num_slots = 0;  // entries of `slots` for this step
  DeviceArray<int32_t> slots, pages, kv_lens;
  std::map<int, DeviceArray<int32_t>> layer_channels;
  std::map<int, DeviceArray<float>> layer_sinks;
  DeviceArray<float> scores, partial;
  DeviceArray<int32_t> selected, counters;
};

}  // namespace specula
