// ModelRunner implementation: start-up checks, pool sizing and the step.
#include "specula/runner/model_runner.h"

#include <algorithm>
#include <bit>
#include <span>

#include "specula/core/error.h"
#include "specula/runner/sampler.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/model/deepseek_cuda.h"
#include "specula/model/llama_cuda.h"
#endif

namespace specula {

ModelRunner::ModelRunner(const ModelConfig& config, const WeightSource& weights, const ModelRunnerOptions& options)
    : config_(config), options_(options) {
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
  const bool mla = config.is_mla();
  if (!o.kv_dtype) o.kv_dtype = gpu || mla ? DType::bf16 : DType::f32;
  // Default: the model's context, capped at 8192 tokens so a long-context model's cache fits in
  // memory (--max-context-len raises it).
  if (o.max_context_len == 0) o.max_context_len = std::min(config.max_position_embeddings, 8192);
  SPECULA_CHECK(o.max_context_len <= config.max_position_embeddings,
                "max_context_len {} exceeds the model's max_position_embeddings {}", o.max_context_len,
                config.max_position_embeddings);

  // A page larger than a whole context only wastes memory (and a huge one exhausts it); small
  // contexts keep the usual page sizes.
  constexpr int64_t kSmallPageLimit = 256;
  const auto max_page = std::max<int64_t>(kSmallPageLimit, std::bit_ceil(static_cast<uint64_t>(o.max_context_len)));
  SPECULA_CHECK(o.page_size <= max_page,
                "page_size {} is not valid; it must be at most {} (max_context_len {} rounded up to a power of two, "
                "or {})", o.page_size, max_page, o.max_context_len, kSmallPageLimit);
  SPECULA_CHECK(o.spec_scratch_tokens >= 0, "spec_scratch_tokens {} is not valid; it must be >= 0",
                o.spec_scratch_tokens);
  SPECULA_CHECK(o.cuda_graph_verify_tokens >= 0 && o.cuda_graph_verify_tokens < kv_capacity(),
                "cuda_graph_verify_tokens {} is not valid; it must be in [0, {})", o.cuda_graph_verify_tokens,
                kv_capacity());
  SPECULA_CHECK(o.cuda_graph_max_bs >= 1, "cuda_graph_max_bs {} is not valid; it must be >= 1", o.cuda_graph_max_bs);
  double kv_bytes_per_token = 0;
  if (mla) {
    SPECULA_CHECK(*o.kv_dtype == DType::bf16 || *o.kv_dtype == DType::fp8_e4m3,
                  "KV cache dtype {} is not available for {} (MLA); use bf16 or fp8_e4m3", dtype_name(*o.kv_dtype),
                  config.architecture);
    init_mla(weights);
    kv_bytes_per_token = static_cast<double>(config.num_hidden_layers) *
                         static_cast<double>(mla_row_bytes(mla_format(), config.mla.kv_lora_rank, config.mla.qk_rope_head_dim));
  } else {
    init_llama(weights);
    kv_bytes_per_token = static_cast<double>(2 * config.num_hidden_layers * config.num_key_value_heads *
                                             config.head_dim * dtype_size(*o.kv_dtype));
  }

  const auto round_up = [&](int64_t tokens) { return (tokens + o.page_size - 1) / o.page_size * o.page_size; };
  const int64_t context = round_up(o.max_context_len + o.spec_scratch_tokens);
  SPECULA_CHECK(o.kv_cache_tokens == 0 || o.kv_cache_tokens >= context,
                "kv_cache_tokens {} cannot hold one request of max_context_len {}{}; give at least {}", o.kv_cache_tokens,
                o.max_context_len,
                o.spec_scratch_tokens > 0 ? fmt::format(" and a speculative cycle's {} scratch tokens", o.spec_scratch_tokens)
                                          : std::string(),
                context);
  if (o.kv_cache_tokens == 0) {
    const auto by_memory = static_cast<int64_t>(o.kv_cache_memory_gib * (1ull << 30) / kv_bytes_per_token);
    o.kv_cache_tokens = std::max(context, std::min(context * o.max_running_requests, by_memory));
  }
  // Whole pages: at most page_size - 1 tokens more than asked for.
  o.kv_cache_tokens = round_up(o.kv_cache_tokens);
  const bool graphs = gpu && o.cuda_graph;
  // With graphs, pages for the padding rows of a graph batch to read and write: one token for
  // decode, the tree after it for verify.
  const int64_t padding_tokens = graphs ? round_up(1 + o.cuda_graph_verify_tokens) : 0;
  allocator_ = std::make_unique<PagedTokenAllocator>(o.kv_cache_tokens + padding_tokens, o.page_size);
  // With graphs, one more row for padding: it is never handed to a request.
  req_pool_ = std::make_unique<ReqToTokenPool>(o.max_running_requests + (graphs ? 1 : 0), kv_capacity());
  if (mla) {
    mla_kv_pool_ = std::make_unique<MLAKVPool>(MLAKVPoolConfig{allocator_->total_slots(), config.num_hidden_layers,
                                                               config.mla.kv_lora_rank, config.mla.qk_rope_head_dim,
                                                               mla_format(), 0, o.device});
  } else {
    kv_pool_ = std::make_unique<MHAKVPool>(KVPoolConfig{allocator_->total_slots(), config.num_hidden_layers,
                                                        config.num_key_value_heads, config.head_dim, config.head_dim,
                                                        *o.kv_dtype, o.device});
  }
#ifdef SPECULA_HAS_CUDA
  if (graphs) {
    std::vector<int> sizes = o.cuda_graph_batch_sizes;
    if (sizes.empty()) {
      for (int bs : {1, 2, 4, 8}) sizes.push_back(bs);
      for (int bs = 16; bs <= o.cuda_graph_max_bs; bs += 8) sizes.push_back(bs);
    }
    std::erase_if(sizes, [&](int bs) { return bs > std::min(o.cuda_graph_max_bs, o.max_running_requests); });
    for (int bs : sizes) SPECULA_CHECK(bs >= 1, "CUDA-graph batch size {} is not valid; it must be >= 1", bs);
    if (!sizes.empty()) {
      // Padding rows are one-token requests in a row and a page of their own.
      padding_req_row_ = req_pool_->alloc(1).value().at(0);
      const std::vector<int32_t> padding = allocator_->alloc(padding_tokens).value();
      req_pool_->write(padding_req_row_, 0, std::span(padding).first(static_cast<size_t>(1 + o.cuda_graph_verify_tokens)));
      const int32_t padding_slot = padding.at(0);
      padding_slot_ = padding_slot;
      const int max_bs = *std::max_element(sizes.begin(), sizes.end());
      const int max_tokens = max_bs * std::max(1, o.cuda_graph_verify_tokens);
      if (mla) {
        mla_backend_->init_cuda_graph_state(max_bs, max_tokens);
        static_cast<DeepseekCudaModel*>(mla_cuda_model_.get())
            ->capture_decode_graphs(*mla_backend_, sizes, padding_req_row_, padding_slot, req_pool_.get(),
                                    mla_kv_pool_.get());
      } else {
        backend_->init_cuda_graph_state(max_bs, max_tokens);
        static_cast<LlamaCudaModel*>(cuda_model_.get())
            ->capture_decode_graphs(*backend_, sizes, padding_req_row_, padding_slot, req_pool_.get(), kv_pool_.get());
      }
    }
  }
#endif
}

void ModelRunner::init_llama(const WeightSource& weights) {
  const ModelRunnerOptions& o = options_;
  const bool gpu = o.device.is_cuda();
  model_ = std::make_unique<LlamaModel>(config_, weights);
  AttentionBackendOptions bo;
#ifdef SPECULA_HAS_CUDA
  if (gpu) {
    auto cuda_model = std::make_shared<LlamaCudaModel>(*model_, o.device, o.deterministic);
    bo.cuda_stream = cuda_model->stream();
    cuda_model_ = cuda_model;
  }
#endif
  bo.device = o.device;
  bo.deterministic = o.deterministic;
  bo.page_size = o.page_size;
  bo.max_context_len = kv_capacity();
  backend_ = make_attention_backend(o.attention_backend, bo);
  // The CPU path attends with f32 queries; the GPU path with bf16 ones.
  for (const AttentionLayer& layer : model_->attention_layers()) {
    backend_->check_layer(layer, gpu ? DType::bf16 : DType::f32, *o.kv_dtype);
  }
}

void ModelRunner::init_mla(const WeightSource& weights) {
  const ModelRunnerOptions& o = options_;
  const bool gpu = o.device.is_cuda();
  SPECULA_CHECK(!o.deterministic, "deterministic inference is not available for {} (multi-head latent attention) yet",
                config_.architecture);
  mla_model_ = std::make_unique<DeepseekModel>(config_, weights);
  MlaBackendOptions bo;
#ifdef SPECULA_HAS_CUDA
  if (gpu) {
    auto cuda_model = std::make_shared<DeepseekCudaModel>(*mla_model_, o.device);
    bo.cuda_stream = cuda_model->stream();
    mla_cuda_model_ = cuda_model;
  }
#endif
  bo.device = o.device;
  bo.page_size = o.page_size;
  bo.max_context_len = kv_capacity();
  bo.extend_form = o.mla_extend_form;
  mla_backend_ = make_mla_backend(o.attention_backend, bo);
  for (const MlaLayer& layer : mla_model_->mla_layers()) {
    mla_backend_->check_layer(layer, gpu ? DType::bf16 : DType::f32, mla_format());
  }
}

MlaKVFormat ModelRunner::mla_format() const {
  return *options_.kv_dtype == DType::fp8_e4m3 ? MlaKVFormat::fp8_ds_mla : MlaKVFormat::bf16;
}

const LlamaModel& ModelRunner::model() const {
  SPECULA_CHECK(model_ != nullptr, "{} is not a Llama-family model (it uses multi-head latent attention)",
                config_.architecture);
  return *model_;
}

MHAKVPool& ModelRunner::kv_pool() {
  SPECULA_CHECK(kv_pool_ != nullptr, "{} keeps a latent (MLA) KV cache, not a per-head one", config_.architecture);
  return *kv_pool_;
}

AttentionBackend& ModelRunner::backend() {
  SPECULA_CHECK(backend_ != nullptr, "{} attends through an MLA backend", config_.architecture);
  return *backend_;
}

size_t ModelRunner::weight_bytes() const {
#ifdef SPECULA_HAS_CUDA
  if (cuda_model_) return static_cast<const LlamaCudaModel*>(cuda_model_.get())->weight_bytes();
  if (mla_cuda_model_) return static_cast<const DeepseekCudaModel*>(mla_cuda_model_.get())->weight_bytes();
#endif
  return model_ ? model_->weight_bytes() : mla_model_->weight_bytes();
}

std::vector<int> ModelRunner::cuda_graph_batch_sizes() const {
#ifdef SPECULA_HAS_CUDA
  if (cuda_model_) return static_cast<const LlamaCudaModel*>(cuda_model_.get())->graph_batch_sizes();
  if (mla_cuda_model_) return static_cast<const DeepseekCudaModel*>(mla_cuda_model_.get())->graph_batch_sizes();
#endif
  return {};
}

void* ModelRunner::cuda_stream() const {
#ifdef SPECULA_HAS_CUDA
  if (cuda_model_) return static_cast<const LlamaCudaModel*>(cuda_model_.get())->stream();
  if (mla_cuda_model_) return static_cast<const DeepseekCudaModel*>(mla_cuda_model_.get())->stream();
#endif
  return nullptr;
}

void ModelRunner::capture_verify_graphs(const std::vector<int>& capture_layers) {
#ifdef SPECULA_HAS_CUDA
  auto* model = static_cast<LlamaCudaModel*>(cuda_model_.get());
  const std::vector<int> sizes = cuda_graph_batch_sizes();
  if (model == nullptr || sizes.empty() || options_.cuda_graph_verify_tokens == 0) return;
  model->capture_verify_graphs(*backend_, sizes, options_.cuda_graph_verify_tokens, capture_layers, padding_req_row_,
                               req_pool_.get(), kv_pool_.get());
#else
  (void)capture_layers;
#endif
}

ModelRunner::~ModelRunner() = default;

namespace {
// The CPU models' greedy tokens, from their host logits.
void greedy_rows(const std::vector<float>& logits, int vocab, std::vector<int32_t>& ids) {
  const size_t rows = logits.size() / static_cast<size_t>(vocab);
  ids.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    ids[r] = greedy_token(std::span<const float>(logits).subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)));
  }
}
}  // namespace

void ModelRunner::forward(ForwardBatch& batch, std::vector<float>& logits, bool all_tokens, HiddenCapture* capture,
                          std::vector<int32_t>* greedy_ids) {
  batch.req_to_token_pool = req_pool_.get();
  SPECULA_CHECK(batch.spec_info == nullptr || batch.spec_info->device_tree_tokens == nullptr ||
                    (cuda_model_ != nullptr && !mla_model_),
                "{}: a verify batch whose tree tokens are on the GPU needs a Llama-family model on the GPU",
                config_.architecture);
  SPECULA_CHECK(capture == nullptr || capture->download || cuda_model_ != nullptr,
                "{}: hidden states kept on the device need a model on the GPU", config_.architecture);
  if (mla_model_) {
    SPECULA_CHECK(capture == nullptr, "{}: capturing hidden states for a draft head is not supported",
                  config_.architecture);
    batch.mla_kv_pool = mla_kv_pool_.get();
#ifdef SPECULA_HAS_CUDA
    if (mla_cuda_model_) {
      auto* model = static_cast<DeepseekCudaModel*>(mla_cuda_model_.get());
      if (use_cuda_graph_ && !all_tokens && model->forward_decode_graph(batch, *mla_backend_, logits, greedy_ids)) return;
      mla_backend_->init_forward_metadata(batch);
      model->forward(batch, *mla_backend_, logits, all_tokens, greedy_ids);
      return;
    }
#endif
    mla_backend_->init_forward_metadata(batch);
    mla_model_->forward(batch, *mla_backend_, logits, all_tokens);
  } else {
    batch.token_to_kv_pool = kv_pool_.get();
#ifdef SPECULA_HAS_CUDA
    if (cuda_model_) {
      auto* model = static_cast<LlamaCudaModel*>(cuda_model_.get());
      if (use_cuda_graph_ && !all_tokens && capture == nullptr &&
          model->forward_decode_graph(batch, *backend_, logits, greedy_ids)) {
        return;
      }
      if (use_cuda_graph_ && all_tokens && model->forward_verify_graph(batch, *backend_, logits, capture, greedy_ids)) {
        return;
      }
      backend_->init_forward_metadata(batch);
      model->forward(batch, *backend_, logits, all_tokens, capture, greedy_ids);
      return;
    }
#endif
    backend_->init_forward_metadata(batch);
    model_->forward(batch, *backend_, logits, all_tokens, capture);
  }
  if (greedy_ids != nullptr) greedy_rows(logits, config_.vocab_size, *greedy_ids);
}

}  // namespace specula
