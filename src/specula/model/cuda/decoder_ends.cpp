// CudaDecoderEnds: upload, embedding lookup and the logits head.
#include "specula/model/cuda/decoder_ends.h"

#include "specula/model/cuda/cuda_linear.h"
#include "specula/core/error.h"
#include "specula/model/cuda/model_ops.h"

namespace specula {

namespace ck = cuda_kernels;

CudaDecoderEnds::CudaDecoderEnds(const CpuDecoder& host, Device device, int64_t vocab_begin, int64_t vocab_end)
    : config_(host.config()) {
  const int64_t V = config_.vocab_size, h = config_.hidden_size;
  if (vocab_end == 0) vocab_end = V;
  SPECULA_CHECK(vocab_begin >= 0 && vocab_begin < vocab_end && vocab_end <= V, "lm_head rows [{}, {}) are not within [0, {})",
                vocab_begin, vocab_end, V);
  vocab_ = static_cast<int>(vocab_end - vocab_begin);
  embed_ = upload_weight(host.embedding(), device);
  final_norm_ = upload_f32(host.final_norm(), device);
  if (vocab_ < V) {
    const std::vector<float>& all = host.lm_head();
    lm_head_ = upload_weight(std::vector<float>(all.begin() + vocab_begin * h, all.begin() + vocab_end * h), device);
  } else if (&host.lm_head() != &host.embedding()) {
    lm_head_ = upload_weight(host.lm_head(), device);
  }
  inv_freq_ = upload_f32(host.inv_freq(), device);
}

size_t CudaDecoderEnds::bytes() const {
  auto held = [](const Buffer& b) { return b.data() != nullptr ? b.nbytes() : 0; };
  return held(embed_) + held(final_norm_) + held(lm_head_);
}

void CudaDecoderEnds::embed_rows(const int32_t* ids, float* x, int64_t n, float scale, cudaStream_t s) const {
  if (embed_.dtype() == DType::bf16) {
    ck::embed_rows_bf16(embed_.data(), ids, x, n, config_.hidden_size, scale, s);
  } else {
    ck::embed_rows(embed_.data_as<const float>(), ids, x, n, config_.hidden_size, scale, s);
  }
}

void CudaDecoderEnds::logits(const float* x, const int32_t* row_ids, int64_t count, float* selected, float* out,
                             const Linear& linear, cudaStream_t s) const {
  const ModelConfig& c = config_;
  const int h = c.hidden_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  if (row_ids != nullptr) {
    ck::gather_rows(x, row_ids, selected, count, h, s);
    ck::rms_norm_rows(selected, final_norm_.data_as<const float>(), selected, count, h, eps, s);
  } else {
    ck::rms_norm_rows(x, final_norm_.data_as<const float>(), selected, count, h, eps, s);
  }
  linear(selected, lm_head_.data() != nullptr ? lm_head_ : embed_, out, count, h, vocab_);
  if (c.final_logit_softcapping > 0) ck::softcap(out, count * vocab_, static_cast<float>(c.final_logit_softcapping), s);
}

}  // namespace specula
