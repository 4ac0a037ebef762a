// make_model and the CPU implementations of Model (LlamaCpu, DeepseekCpu): the f32 host models
// with their attention backend. The GPU implementations are in model/cuda_models.cpp.
#include "specula/model/model.h"

#include <algorithm>

#include "specula/model/fp8_weights.h"

#include "specula/core/error.h"
#include "specula/model/deepseek.h"
#include "specula/model/llama.h"
#include "specula/model/moe.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/model/cuda_models.h"
#include "specula/model/tp_model.h"
#endif
#include "specula/model/tp_shard.h"

namespace specula {

namespace {

class LlamaCpu final : public Model {
 public:
  LlamaCpu(const ModelConfig& config, const WeightSource& weights, const ModelOptions& o)
      : model_(config, weights), backend_(make_llama_backend(model_, o, nullptr)) {}
  const ModelConfig& config() const override { return model_.config(); }
  size_t weight_bytes() const override { return model_.weight_bytes(); }
  size_t decode_weight_bytes() const override { return model_.weight_bytes() - moe_unread_bytes(model_.config(), sizeof(float)); }
  AttentionBackend* attention_backend() override { return backend_.get(); }
  const LlamaModel* llama() const override { return &model_; }
  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) override {
    backend_->init_forward_metadata(batch);
    model_.forward(batch, *backend_, logits, r.all_tokens, r.capture);
  }

 private:
  LlamaModel model_;
  std::unique_ptr<AttentionBackend> backend_;
};

class DeepseekCpu final : public Model {
 public:
  DeepseekCpu(const ModelConfig& config, const WeightSource& weights, const ModelOptions& o)
      : model_(config, weights), backend_(make_deepseek_backend(model_, o, nullptr)) {}
  const ModelConfig& config() const override { return model_.config(); }
  size_t weight_bytes() const override { return model_.weight_bytes(); }
  size_t decode_weight_bytes() const override { return model_.weight_bytes() - moe_unread_bytes(model_.config(), sizeof(float)); }
  MlaAttentionBackend* mla_backend() override { return backend_.get(); }
  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) override {
    SPECULA_CHECK(r.capture == nullptr, "{}: capturing hidden states for a draft head is not supported",
                  model_.config().architecture);
    backend_->init_forward_metadata(batch);
    model_.forward(batch, *backend_, logits, r.all_tokens);
  }

 private:
  DeepseekModel model_;
  std::unique_ptr<MlaAttentionBackend> backend_;
};

}  // namespace

MlaKVFormat mla_kv_format(DType kv_dtype) {
  return kv_dtype == DType::fp8_e4m3 ? MlaKVFormat::fp8_ds_mla : MlaKVFormat::bf16;
}

std::unique_ptr<AttentionBackend> make_llama_backend(const LlamaModel& model, const ModelOptions& o, void* stream) {
  AttentionBackendOptions bo;
  bo.device = o.device;
  bo.deterministic = o.deterministic;
  bo.page_size = o.page_size;
  bo.max_context_len = o.max_kv_len;
  bo.cuda_stream = stream;
  bo.double_sparsity = o.double_sparsity;
  auto backend = make_attention_backend(o.attention_backend, bo);
  // The CPU path attends with f32 queries; the GPU path with bf16 ones.
  for (const AttentionLayer& layer : model.attention_layers()) {
    backend->check_layer(layer, o.device.is_cuda() ? DType::bf16 : DType::f32, o.kv_dtype);
  }
  return backend;
}

std::unique_ptr<MlaAttentionBackend> make_deepseek_backend(const DeepseekModel& model, const ModelOptions& o,
                                                           void* stream) {
  MlaBackendOptions bo;
  bo.device = o.device;
  bo.page_size = o.page_size;
  bo.max_context_len = o.max_kv_len;
  bo.extend_form = o.mla_extend_form;
  bo.cuda_stream = stream;
  auto backend = make_mla_backend(o.attention_backend, bo);
  for (const MlaLayer& layer : model.mla_layers()) {
    backend->check_layer(layer, o.device.is_cuda() ? DType::bf16 : DType::f32, mla_kv_format(o.kv_dtype));
  }
  return backend;
}

std::unique_ptr<Model> make_model(const ModelConfig& config, const WeightSource& weights, const ModelOptions& options) {
  if (config.dual_chunk.enabled() && !config.dual_chunk.active_up_to(options.max_kv_len)) {
    // Every context this engine admits fits in one chunk and the original length: the model is
    // plain attention, on any backend.
    ModelConfig plain = config;
    plain.dual_chunk = {};
    return make_model(plain, weights, options);
  }
  if (config.fp8_weights()) {
    // fp8 block-scaled weights are dequantized as they are read (the models hold f32 or bf16).
    const Fp8BlockWeights dequantized(weights, config);
    ModelConfig plain = config;
    plain.fp8_block_out = plain.fp8_block_in = 0;
    return make_model(plain, dequantized, options);
  }
  // Before any weight is read: a flag error should not wait for the checkpoint to load.
  SPECULA_CHECK(!(options.deterministic && config.is_mla()),
                "deterministic inference is not available for {} (multi-head latent attention) yet", config.architecture);
  check_tensor_parallel(config, options.tp_size);
  SPECULA_CHECK(options.tp_size == 1 || options.device.is_cuda(), "--tp-size {} needs --device cuda", options.tp_size);
  if (options.device.is_cuda()) {
#ifdef SPECULA_HAS_CUDA
    if (options.tp_size > 1) return make_tensor_parallel_model(config, weights, options);
    return make_cuda_model(config, weights, options);
#else
    SPECULA_CHECK(false, "--device {}: this build has no CUDA support", options.device.str());
#endif
  }
  if (config.is_mla()) return std::make_unique<DeepseekCpu>(config, weights, options);
  return std::make_unique<LlamaCpu>(config, weights, options);
}

}  // namespace specula
