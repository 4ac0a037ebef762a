// The CUDA attention backend's internals shared by its source files (cuda_backend.cpp, and
// cuda_backend_dual_chunk.cpp for dual chunk attention): the step state and the launch params
// every non-tree launch shares. Not for use outside attention/cuda.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>
#include <cuda_runtime_api.h>

#include "specula/attention/cuda/cuda_backend.h"
#include "specula/attention/cuda/dual_chunk_plan.h"
#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/core/tensor.h"
#include "specula/core/device_array.h"
#include "specula/core/upload_batch.h"

namespace specula {

class MHAKVPool;

struct CudaAttentionBackend::State {
  Device device;
  cudaStream_t stream = nullptr;
  UploadBatch uploads{Device::cpu()};  // the step's metadata, flushed once per build_metadata

  ForwardMode mode = ForwardMode::IDLE;
  const ForwardBatch* batch = nullptr;
  int64_t num_tokens = 0;
  int num_seqs = 0;
  int page_table_stride = 0;
  int max_kv_len = 0;
  int num_items = 0;
  int local_num_seqs = 0;
  int local_stride = 0;
  int local_num_items = 0;
  int64_t kv_rows = 0;        // K/V rows the step's sequences attend (the local batches' with chunking)
  int64_t local_kv_rows = 0;
  bool has_custom_mask = false;
  bool tree_path = false;  // TARGET_VERIFY with a visible prefix: the tree kernel's arrays are set
  int tree_rows_per_seq = 0;
  std::map<HeadLayout, DecodePlan> decode_plans;

  // Per-step arrays every mode uses: one set for eager steps (grows freely) and one for CUDA
  // graphs (sized once, frozen, so captured kernels keep valid pointers).
  struct StepArrays {
    DeviceArray<int32_t> cu_q, kv_lens, pages, out_loc, items;
    DeviceArray<int32_t> tree_slots, tree_lens, prefix_lens;  // TARGET_VERIFY through the tree kernel
    DeviceArray<float> partial_out, partial_lse;
    DeviceArray<uint32_t> split_counters;  // decode.cu's merge counts; zero between launches
    DeviceArray<int64_t> mask_offsets;
    DeviceArray<uint8_t> custom_mask;
  };
  StepArrays eager;
  StepArrays graph;
  StepArrays* active = &eager;
  DeviceArray<int32_t> local_cu_q, local_kv_lens, local_pages, local_items;
  // Dual chunk attention's extend-like steps (dual_chunk_plan.h): the plan's arrays, and the
  // passes' f32 partial results when there is more than one.
  CudaDualChunkPlan dca;
  bool dca_staged = false;
  DeviceArray<int32_t> dca_cu_q, dca_items;
  std::array<DeviceArray<int32_t>, 3> dca_kv_lens, dca_pages;
  DeviceArray<float> dca_temperature, dca_parts, dca_lse;
  // Its sparse runs: the plan's arrays, the selection's workspace and bitmaps, and per layer id
  // the pattern's kept lines per head (vertical, then slash), uploaded once.
  DeviceArray<int32_t> dca_keep_run, dca_q_base, dca_sparse_runs;
  std::array<DeviceArray<int32_t>, 3> dca_key_base;
  DeviceArray<float> dca_sparse_temperature, dca_partial, dca_est_lse, dca_vertical, dca_slash;
  DeviceArray<uint32_t> dca_keep_cols, dca_keep_dists;
  std::map<int, std::pair<std::vector<int32_t>, Buffer>> dca_lines;
  // Sinks per layer id, uploaded once (and again only if the values change).
  std::map<int, std::pair<std::vector<float>, Buffer>> sinks;

  bool graph_mode = false;
  int graph_max_bs = 0;
  int graph_pages_stride = 0;
};

struct CudaAttentionBackend::Sequences {
  std::vector<int32_t> q_lens, kv_lens, cu_q;
  PageTable table;
};

// The params fields every non-tree launch of the CUDA backend shares: q, out, the layer's cache
// and its facts.
cuda_kernels::AttentionParams cuda_layer_params(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                                const MHAKVPool& pool, const ForwardOptions& options, int page_size);

}  // namespace specula
