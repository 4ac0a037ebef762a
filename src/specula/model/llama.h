// LlamaModel: the Llama-family decoder (RMSNorm, RoPE, grouped-query attention through an
// AttentionBackend over the paged KV cache, SwiGLU MLP) on the CPU: weights held as f32 (converted
// from the checkpoint once), matrix products through OpenBLAS. The family's variants are flags of
// the config: q/k/v biases (Qwen2), q/k RMSNorm (Qwen3), per-layer sliding windows (Mistral, Qwen2),
// and Gemma-2's norms, embedding scale, GeLU-tanh, soft-caps and alternating windows.
#pragma once

#include <vector>

#include "specula/attention/backend.h"
#include "specula/model/config.h"
#include "specula/model/cpu_decoder.h"
#include "specula/model/decoder_layer.h"
#include "specula/model/hidden_capture.h"
#include "specula/model/weights.h"

namespace specula {

// Dual chunk attention: each new token's key temperature (dual_chunk_logit_scale of its request's
// length), which multiplies its key before the cache write; empty without an original length.
std::vector<float> dual_chunk_key_scales(const DualChunkAttentionConfig& config, const ForwardBatch& batch);

class LlamaModel : public CpuDecoder {
 public:
  // routed_experts false: mixture-of-experts layers hold all but their routed experts (a GPU
  // model loads those itself); such a model cannot run forward on the CPU. layer_matrices false:
  // the layers hold their norms and biases but not q/k/v/o and the MLP's matrices, which a GPU
  // model reads straight from the checkpoint (no f32 copy on the host); nor can it run on the CPU.
  LlamaModel(const ModelConfig& config, const WeightSource& weights, bool routed_experts = true,
             bool layer_matrices = true);

  // One AttentionLayer per decoder layer (for backend checks and KV pool sizing).
  const std::vector<AttentionLayer>& attention_layers() const { return attention_layers_; }
  // Bytes of weights one decode step reads (all of them, as held: f32).
  size_t weight_bytes() const;

  // Runs the batch (its input_ids / positions / KV slots); writes f32 logits of the last token of
  // each request ([batch_size, vocab_size]) or, with all_tokens, of every token
  // ([num_tokens, vocab_size]). The backend's metadata must be initialised for this batch.
  // capture (optional) receives hidden states of every token for a draft head.
  void forward(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits, bool all_tokens = false,
               HiddenCapture* capture = nullptr);

 public:
  // The weights as held (f32), for other executors of the same model (the CUDA one uploads them).
  using Layer = DecoderLayerWeights;

  const std::vector<Layer>& layers() const { return layers_; }

 private:
  std::vector<Layer> layers_;
  std::vector<AttentionLayer> attention_layers_;
};

}  // namespace specula
