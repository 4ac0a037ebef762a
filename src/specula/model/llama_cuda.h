// LlamaCudaModel: the same decoder as LlamaModel, executed on a CUDA device: f32 weights and
// activations, cuBLAS sgemm (no TF32) for the projections, the element-wise kernels of
// model/cuda, and bf16 q/k/v through the CUDA attention backend over a bf16 paged KV cache.
// (bf16 weights with cuBLASLt and fused kernels are the performance step that follows.)
#pragma once

#include <array>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/core/tensor.h"
#include "specula/model/llama.h"

namespace specula {

class LlamaCudaModel {
 public:
  // Uploads the host model's weights.
  LlamaCudaModel(const LlamaModel& host, Device device);
  ~LlamaCudaModel();
  LlamaCudaModel(const LlamaCudaModel&) = delete;
  LlamaCudaModel& operator=(const LlamaCudaModel&) = delete;

  // As LlamaModel::forward; logits come back to the host.
  void forward(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits, bool all_tokens = false);

 private:
  struct Layer {
    Buffer input_norm, post_norm, post_attn_norm, post_ffn_norm;
    Buffer wq, wk, wv, wo, bq, bk, bv, bo, b_gate, b_up, b_down, q_norm, k_norm, w_gate, w_up, w_down;
  };
  // y[n, out] = x[n, in] w[out, in]^T (+ bias)
  void linear(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out);
  Buffer& scratch(size_t slot, DType dtype, int64_t elements);

  const LlamaModel& host_;
  Device device_;
  void* cublas_ = nullptr;
  Buffer embed_, final_norm_, lm_head_, inv_freq_;
  std::vector<Layer> layers_;
  // Fixed slots: references handed out by scratch() must survive later calls (a growing vector
  // would move its Buffers and leave them dangling).
  static constexpr size_t kScratchSlots = 18;
  std::array<Buffer, kScratchSlots> scratch_;
};

}  // namespace specula
