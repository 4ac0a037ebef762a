// The expanded form of MLA extend on the GPU (CudaMlaBackend::forward_expanded): per step, the
// plan cuts the requests' cached rows (all requests' rows in order) into passes of at most
// chunk_rows rows; per layer, each pass gathers its latent rows from the pool, has the model
// expand them into per-head K / V (MlaExpandFn), runs the warpgroup-MMA prefill kernel at width
// 192 / 128 over those ragged rows (causal through per-request query offsets: a pass of prefix
// rows is fully visible, the pass holding a request's own tokens is causal), and merges the pass
// into the output with merge_state.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "specula/attention/mla/mla_backend.h"
#include "specula/core/device_array.h"
#include "specula/core/tensor.h"
#include "specula/core/upload_batch.h"

namespace specula {

// Rows of a default pass: as many as fit 512 MiB of expanded keys and values and their latent
// rows (bf16).
int64_t default_expanded_chunk_rows(int num_q_heads);

// Whether the expanded kernels serve a layer: "" or why not.
std::string expanded_layer_problem(const MlaLayer& layer);

class MlaExpandedPass {
 public:
  // l2_bytes: the device's L2 size, which bounds the K/V rows that blocks running together read.
  MlaExpandedPass(Device device, cudaStream_t stream, int64_t l2_bytes)
      : device_(device), stream_(stream), l2_bytes_(l2_bytes), uploads_(device) {}

  // Once per step: kv_lens / q_lens per request, slots the cache slot of every request's every key
  // (request 0's kv_lens[0] keys first).
  void plan(const std::vector<int32_t>& kv_lens, const std::vector<int32_t>& q_lens,
            const std::vector<int32_t>& slots, int64_t chunk_rows);

  // Per layer: q bf16 [n, H, 192], out bf16 [n, H, 128], lse f32 [n, H] (or undefined).
  void run(const TensorView& q, const TensorView& out, const TensorView& lse, const uint8_t* cache, bool fp8,
           int64_t row_bytes, const MlaLayer& layer, const float* sinks, const MlaExpandFn& expand);

 private:
  struct Pass {
    int64_t first_row = 0;  // into the step's slot list
    int64_t rows = 0;
  };
  Device device_;
  cudaStream_t stream_;
  int64_t l2_bytes_;
  int batch_size_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<Pass> passes_;
  UploadBatch uploads_;
  DeviceArray<int32_t> slots_, cu_q_, items_, pass_meta_;  // pass_meta_: per pass [row_start; kv_len; q_offset] x batch
  int num_items_ = 0;
  DeviceArray<bf16_t> kv_c_, k_pe_, k_, v_, part_out_;
  DeviceArray<float> part_lse_, lse_;
};

}  // namespace specula
