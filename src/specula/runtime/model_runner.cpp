// ModelRunner implementation: start-up checks, pool sizing and the step.
#include "specula/runtime/model_runner.h"

#include <algorithm>

#include "specula/core/error.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/model/llama_cuda.h"
#endif

namespace specula {

ModelRunner::ModelRunner(const ModelConfig& config, const WeightSource& weights, const ModelRunnerOptions& options)
    : options_(options) {
  ModelRunnerOptions& o = options_;
  const bool gpu = o.device.is_cuda();
  SPECULA_CHECK(!gpu || cuda_available(), "--device {}: this build or machine has no CUDA device", o.device.str());
  SPECULA_CHECK(o.page_size >= 1 && (o.page_size & (o.page_size - 1)) == 0,
                "page_size {} is not valid; it must be a power of two >= 1", o.page_size);
  SPECULA_CHECK(o.max_context_len >= 0, "max_context_len {} is not valid; it must be >= 0 (0: the model's)",
                o.max_context_len);
  SPECULA_CHECK(o.max_running_requests >= 1, "max_running_requests {} is not valid; it must be >= 1",
                o.max_running_requests);
  SPECULA_CHECK(o.kv_cache_tokens >= 0, "kv_cache_tokens {} is not valid; it must be >= 0 (0: automatic)",
                o.kv_cache_tokens);
  if (o.attention_backend.empty()) o.attention_backend = gpu ? "cuda" : "cpu";
  if (!o.kv_dtype) o.kv_dtype = gpu ? DType::bf16 : DType::f32;
  // Default: the model's context, capped at 8192 tokens so a long-context model's cache fits in
  // memory (--max-context-len raises it).
  if (o.max_context_len == 0) o.max_context_len = std::min(config.max_position_embeddings, 8192);
  SPECULA_CHECK(o.max_context_len <= config.max_position_embeddings,
                "max_context_len {} exceeds the model's max_position_embeddings {}", o.max_context_len,
                config.max_position_embeddings);

  model_ = std::make_unique<LlamaModel>(config, weights);
#ifdef SPECULA_HAS_CUDA
  if (gpu) cuda_model_ = std::make_shared<LlamaCudaModel>(*model_, o.device);
#endif

  AttentionBackendOptions bo;
  bo.device = o.device;
  bo.page_size = o.page_size;
  bo.max_context_len = o.max_context_len;
  backend_ = make_attention_backend(o.attention_backend, bo);
  // The CPU path attends with f32 queries; the GPU path with bf16 ones.
  for (const AttentionLayer& layer : model_->attention_layers()) {
    backend_->check_layer(layer, gpu ? DType::bf16 : DType::f32, *o.kv_dtype);
  }

  const auto round_up = [&](int64_t tokens) { return (tokens + o.page_size - 1) / o.page_size * o.page_size; };
  const int64_t context = round_up(o.max_context_len);
  if (o.kv_cache_tokens == 0) {
    const auto bytes_per_token = static_cast<double>(2 * config.num_hidden_layers * config.num_key_value_heads *
                                                     config.head_dim * dtype_size(*o.kv_dtype));
    const auto by_memory = static_cast<int64_t>(o.kv_cache_memory_gib * (1ull << 30) / bytes_per_token);
    o.kv_cache_tokens = std::max(context, std::min(context * o.max_running_requests, by_memory));
  }
  o.kv_cache_tokens = round_up(o.kv_cache_tokens);
  SPECULA_CHECK(o.kv_cache_tokens >= context,
                "kv_cache_tokens {} cannot hold one request of max_context_len {}; give at least {}",
                o.kv_cache_tokens, o.max_context_len, context);
  allocator_ = std::make_unique<PagedTokenAllocator>(o.kv_cache_tokens, o.page_size);
  req_pool_ = std::make_unique<ReqToTokenPool>(o.max_running_requests, o.max_context_len);
  kv_pool_ = std::make_unique<MHAKVPool>(KVPoolConfig{allocator_->total_slots(), config.num_hidden_layers,
                                                      config.num_key_value_heads, config.head_dim, config.head_dim,
                                                      *o.kv_dtype, o.device});
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::forward(ForwardBatch& batch, std::vector<float>& logits, bool all_tokens) {
  batch.req_to_token_pool = req_pool_.get();
  batch.token_to_kv_pool = kv_pool_.get();
  backend_->init_forward_metadata(batch);
#ifdef SPECULA_HAS_CUDA
  if (cuda_model_) {
    static_cast<LlamaCudaModel*>(cuda_model_.get())->forward(batch, *backend_, logits, all_tokens);
    return;
  }
#endif
  model_->forward(batch, *backend_, logits, all_tokens);
}

}  // namespace specula
