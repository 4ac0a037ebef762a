// CudaDecoderEnds: a CpuDecoder's embedding, final norm, lm_head and RoPE frequencies on the
// device (matrices bf16 when the checkpoint is, see upload_weight), with the embedding lookup
// and the logits head of the GPU decoders (LlamaCudaModel, DeepseekCudaModel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "specula/core/tensor.h"
#include "specula/model/cpu_decoder.h"

namespace specula {

class CudaDecoderEnds {
 public:
  // vocab_begin, vocab_end: the lm_head rows to hold (0, 0: all; a tensor-parallel rank holds
  // its part, and its logits are [count, vocab_end - vocab_begin]).
  CudaDecoderEnds(const CpuDecoder& host, Device device, int64_t vocab_begin = 0, int64_t vocab_end = 0);

  const Buffer& final_norm() const { return final_norm_; }
  const Buffer& inv_freq() const { return inv_freq_; }
  size_t bytes() const;  // of the weights (embedding, final norm, lm_head) as held on the device
  int vocab_size() const { return vocab_; }  // the lm_head's rows

  // x[t, :] = embedding row ids[t] * scale, t < n.
  void embed_rows(const int32_t* ids, float* x, int64_t n, float scale, cudaStream_t s) const;

  // y[n, out] = x[n, in] w[out, in]^T: the decoder's product (its kernels and scratch).
  using Linear = std::function<void(const float* x, const Buffer& w, float* y, int64_t n, int in, int out)>;
  // Logits of `count` rows of x [*, hidden]: rows row_ids (device memory) or the first `count`
  // when nullptr, through selected [count, hidden] (scratch) into out [count, vocab]: final
  // norm, lm_head, then the config's final soft-cap.
  void logits(const float* x, const int32_t* row_ids, int64_t count, float* selected, float* out, const Linear& linear,
              cudaStream_t s) const;

 private:
  const ModelConfig& config_;
  Buffer embed_, final_norm_, lm_head_, inv_freq_;  // lm_head_ empty when tied and whole
  int vocab_ = 0;
};

}  // namespace specula
