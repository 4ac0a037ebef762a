// DeepseekCudaModel: the same decoder as DeepseekModel, executed on a CUDA device; DECODE steps
// can run as CUDA graphs captured per batch size, padded up to the next captured size. Weight
// matrices are held in bf16 when the checkpoint's values are bf16 (else f32), except kv_b_proj,
// whose per-head halves W_UK and W_UV multiply f32 activations in cuBLAS strided-batched sgemms;
// activations are f32. One product computes q (or q_a) and the latent [c ; k_pe] together; bf16
// absorbed queries go to the CUDA MLA backend, which writes the latent rows into the pool (bf16
// or fp8_ds_mla) and returns latent outputs. Extend steps the backend plans in the expanded form
// send [q_nope ; q_pe] instead and get per-head values back; the model expands the cached latent
// rows the backend gathers with bf16 batched GEMMs per pass (kv_b_proj rounded to bf16: the
// keys and values are bf16 MMA operands anyway).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "specula/attention/mla/mla_backend.h"
#include "specula/core/pinned_buffer.h"
#include "specula/core/tensor.h"
#include "specula/model/cuda/decode_graphs.h"
#include "specula/model/cuda/decoder_ends.h"
#include "specula/model/cuda/workspace.h"
#include "specula/model/deepseek.h"

namespace specula {

class CudaLinear;
class ReqToTokenPool;

class DeepseekCudaModel {
 public:
  DeepseekCudaModel(const DeepseekModel& host, Device device);
  ~DeepseekCudaModel();
  DeepseekCudaModel(const DeepseekCudaModel&) = delete;
  DeepseekCudaModel& operator=(const DeepseekCudaModel&) = delete;

  // The cudaStream_t all of the model's work runs on; the MLA backend must use it too.
  void* stream() const { return stream_; }
  size_t weight_bytes() const;

  // As DeepseekModel::forward; the logits come back to the host, or with greedy_ids only each
  // returned row's greedy token (as LlamaCudaModel's; also for the graph path below).
  void forward(const ForwardBatch& batch, MlaAttentionBackend& backend, std::vector<float>& logits,
               bool all_tokens = false, std::vector<int32_t>* greedy_ids = nullptr);

  // As LlamaCudaModel's: one DECODE-step graph per batch size, after the backend's
  // init_cuda_graph_state(max size); padding rows are one-token requests in padding_req_row
  // whose token is KV slot padding_slot.
  void capture_decode_graphs(MlaAttentionBackend& backend, std::vector<int> batch_sizes, int32_t padding_req_row,
                             int32_t padding_slot, ReqToTokenPool* req_pool, MLAKVPool* kv_pool);
  // Runs a DECODE batch through the smallest captured graph that holds it; false (nothing run)
  // when there is none.
  bool forward_decode_graph(const ForwardBatch& batch, MlaAttentionBackend& backend, std::vector<float>& logits,
                            std::vector<int32_t>* greedy_ids = nullptr);
  std::vector<int> graph_batch_sizes() const;

 private:
  struct Layer {
    Buffer input_norm, post_norm;
    Buffer w_in;       // [q rows + kv_lora_rank + rope, hidden]: q_proj (or q_a_proj) | kv_a_proj_with_mqa
    Buffer q_a_norm, wq_b, kv_a_norm;
    Buffer wkv_b;      // f32 [heads * (nope + v), kv_lora_rank]
    Buffer wkv_b_bf16;  // the same in bf16, for the expanded form's keys and values
    Buffer wo, w_gate_up, w_down;
  };
  enum Slot : size_t {
    kIds, kPositions, kX, kXn, kIn, kQa, kQ, kQLatent, kQAbs, kKvC, kKPe, kOut, kOutF32, kValues, kO, kGateUp, kAct,
    kRows, kSelected, kLogits, kHi, kLo, kNumSlots
  };
  using Workspace = CudaWorkspace<kNumSlots>;
  Buffer& scratch(Workspace& ws, Slot slot, DType dtype, int64_t elements);
  // The bf16 hi/lo scratch a product of w over n rows needs (nullptrs when it needs none).
  std::pair<void*, void*> split_scratch(Workspace& ws, const Buffer& w, int64_t n, int in);
  void linear(Workspace& ws, const float* x, const Buffer& w, float* y, int64_t n, int in, int out);
  // The decoder layers over n tokens whose ids and positions are in kIds / kPositions; the final
  // hidden states are left in kX.
  void run_layers(const ForwardBatch& batch, MlaAttentionBackend& backend, Workspace& ws, int64_t n);
  // Final norm and lm_head over `count` rows of kX (row ids in device memory, or the first `count`
  // rows when nullptr); returns the f32 logits (kLogits).
  float* run_head(Workspace& ws, const int32_t* row_ids, int64_t count);

  const DeepseekModel& host_;
  Device device_;
  void* stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<CudaLinear> linear_;
  PinnedBuffer pinned_;
  Buffer greedy_dev_;  // the device's greedy tokens of a step (download_step)
  std::unique_ptr<CudaDecoderEnds> ends_;
  std::vector<Layer> layers_;
  Workspace eager_;
  Workspace graph_ws_;
  DecodeGraphs graphs_;
};

}  // namespace specula
