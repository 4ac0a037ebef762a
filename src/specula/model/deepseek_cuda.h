// DeepseekCudaModel: the same decoder as DeepseekModel, executed on a CUDA device, eagerly (no
// captured graphs yet). Weight matrices are held in bf16 when the checkpoint's values are bf16
// (else f32), except kv_b_proj, whose per-head halves W_UK and W_UV multiply f32 activations in
// cuBLAS strided-batched sgemms; activations are f32. One product computes q (or q_a) and the
// latent [c ; k_pe] together; bf16 absorbed queries go to the CUDA MLA backend, which writes the
// latent rows into the pool (bf16 or fp8_ds_mla) and returns latent outputs.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "specula/attention/mla/mla_backend.h"
#include "specula/core/pinned_buffer.h"
#include "specula/core/tensor.h"
#include "specula/model/deepseek.h"

namespace specula {

class CudaLinear;

class DeepseekCudaModel {
 public:
  DeepseekCudaModel(const DeepseekModel& host, Device device);
  ~DeepseekCudaModel();
  DeepseekCudaModel(const DeepseekCudaModel&) = delete;
  DeepseekCudaModel& operator=(const DeepseekCudaModel&) = delete;

  // The cudaStream_t all of the model's work runs on; the MLA backend must use it too.
  void* stream() const { return stream_; }
  size_t weight_bytes() const;

  // As DeepseekModel::forward; the logits come back to the host.
  void forward(const ForwardBatch& batch, MlaAttentionBackend& backend, std::vector<float>& logits,
               bool all_tokens = false);

 private:
  struct Layer {
    Buffer input_norm, post_norm;
    Buffer w_in;       // [q rows + kv_lora_rank + rope, hidden]: q_proj (or q_a_proj) | kv_a_proj_with_mqa
    Buffer q_a_norm, wq_b, kv_a_norm;
    Buffer wkv_b;      // f32 [heads * (nope + v), kv_lora_rank]
    Buffer wo, w_gate_up, w_down;
  };
  // Activation buffer `slot`, grown to hold `elements` values of dtype.
  Buffer& scratch(size_t slot, DType dtype, int64_t elements);
  void linear(const float* x, const Buffer& w, float* y, int64_t n, int in, int out);

  const DeepseekModel& host_;
  Device device_;
  void* stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<CudaLinear> linear_;
  PinnedBuffer pinned_;
  Buffer embed_, final_norm_, lm_head_, inv_freq_;
  std::vector<Layer> layers_;
  std::array<Buffer, 22> slots_;  // activations, grown with the batch
};

}  // namespace specula
