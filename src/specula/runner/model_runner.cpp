// ModelRunner implementation: start-up checks, pool sizing and the step.
#include "specula/runner/model_runner.h"

#include <algorithm>
#include <bit>
#include <span>

#include "specula/core/error.h"
#include "specula/model/tp_shard.h"
#include "specula/runner/sampler.h"

namespace specula {

ModelRunner::ModelRunner(const ModelConfig& config, const WeightSource& weights, const ModelRunnerOptions& options)
    : options_(options) {
  init(config, [&](const ModelOptions& mo) { return make_model(config, weights, mo); });
}

ModelRunner::ModelRunner(std::unique_ptr<Model> model, const ModelRunnerOptions& options) : options_(options) {
  SPECULA_CHECK(model != nullptr, "ModelRunner needs a model");
  const ModelConfig config = model->config();
  init(config, [&](const ModelOptions&) { return std::move(model); });
}

void ModelRunner::init(const ModelConfig& config, const std::function<std::unique_ptr<Model>(const ModelOptions&)>& make) {
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
    kv_bytes_per_token = static_cast<double>(config.num_hidden_layers) *
                         static_cast<double>(mla_row_bytes(mla_kv_format(*o.kv_dtype), config.mla.kv_lora_rank, config.mla.qk_rope_head_dim));
  } else {
    // Under tensor parallelism, what one GPU holds: its KV heads.
    check_tensor_parallel(config, o.tp_size);
    const auto kv_heads = o.tp_size > 1 ? tp_layout(config, {0, o.tp_size}).kv_heads.size() : config.num_key_value_heads;
    kv_bytes_per_token = static_cast<double>(2 * config.num_hidden_layers * kv_heads * config.head_dim *
                                             dtype_size(*o.kv_dtype));
  }
  SPECULA_CHECK(o.tp_size == 1 || gpu, "--tp-size {} needs --device cuda (one rank per GPU)", o.tp_size);

  std::shared_ptr<const DoubleSparsityConfig> ds;
  if (o.double_sparsity.enabled) {
    SPECULA_CHECK(!mla, "--enable-double-sparsity: {} uses multi-head latent attention; double sparsity serves "
                  "Llama-family attention", config.architecture);
    SPECULA_CHECK(!o.deterministic, "--enable-double-sparsity cannot be combined with --enable-deterministic-inference: "
                  "which keys a decode reads, and how it splits them, depend on the batch");
    const DoubleSparsityOptions& d = o.double_sparsity;
    ds = std::make_shared<const DoubleSparsityConfig>(load_double_sparsity_config(
        d.channel_config_path, config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
        d.heavy_channel_num, d.heavy_token_num, d.sparse_decode_threshold, d.heavy_channel_type));
    // The label cache sits beside the KV: f32 on the host, the cache's dtype on a GPU.
    kv_bytes_per_token += static_cast<double>(config.num_hidden_layers) * config.num_key_value_heads *
                          d.heavy_channel_num * static_cast<double>(gpu ? dtype_size(*o.kv_dtype) : sizeof(float));
    // Which decode path a step takes (sparse or dense) is decided per step on the host, so decode
    // steps run eagerly, as SGLang's double sparsity does.
    o.cuda_graph = false;
  }

  ModelOptions mo;
  mo.double_sparsity = ds;
  mo.device = o.device;
  mo.attention_backend = o.attention_backend;
  mo.page_size = o.page_size;
  mo.max_kv_len = kv_capacity();
  mo.kv_dtype = *o.kv_dtype;
  mo.deterministic = o.deterministic;
  mo.mla_extend_form = o.mla_extend_form;
  mo.fp8_experts = o.fp8_experts;
  mo.tp_size = o.tp_size;
  model_ = make(mo);

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
    const MLAKVPoolConfig kv{allocator_->total_slots(), config.num_hidden_layers, config.mla.kv_lora_rank,
                             config.mla.qk_rope_head_dim, mla_kv_format(*o.kv_dtype), 0, o.device};
    if (model_->owns_kv_cache()) {
      model_->create_mla_kv_cache(kv);
    } else {
      mla_kv_pool_ = std::make_unique<MLAKVPool>(kv);
    }
  } else {
    const KVPoolConfig kv{allocator_->total_slots(), config.num_hidden_layers, config.num_key_value_heads,
                          config.head_dim, config.head_dim, *o.kv_dtype, o.device};
    if (model_->owns_kv_cache()) {
      model_->create_kv_cache(kv);
    } else {
      kv_pool_ = std::make_unique<MHAKVPool>(kv);
    }
  }
  if (graphs && model_->on_gpu()) {
    std::vector<int> sizes = o.cuda_graph_batch_sizes;
    if (sizes.empty()) {
      for (int bs : {1, 2, 4, 8}) sizes.push_back(bs);
      for (int bs = 16; bs <= o.cuda_graph_max_bs; bs += 8) sizes.push_back(bs);
    }
    std::erase_if(sizes, [&](int bs) { return bs > std::min(o.cuda_graph_max_bs, o.max_running_requests); });
    for (int bs : sizes) SPECULA_CHECK(bs >= 1, "CUDA-graph batch size {} is not valid; it must be >= 1", bs);
    if (!sizes.empty()) {
      // Padding rows are one-token requests in a row and a page of their own.
      GraphSetup& g = graph_setup_;
      g.batch_sizes = sizes;
      g.padding_req_row = req_pool_->alloc(1).value().at(0);
      const std::vector<int32_t> padding = allocator_->alloc(padding_tokens).value();
      req_pool_->write(g.padding_req_row, 0, std::span(padding).first(static_cast<size_t>(1 + o.cuda_graph_verify_tokens)));
      g.padding_slot = padding.at(0);
      g.req_pool = req_pool_.get();
      g.kv_pool = kv_pool_.get();
      g.mla_kv_pool = mla_kv_pool_.get();
      const int max_bs = *std::max_element(sizes.begin(), sizes.end());
      model_->capture_decode_graphs(g, max_bs * std::max(1, o.cuda_graph_verify_tokens));
    }
  }
}

const LlamaModel& ModelRunner::llama_model() const {
  const LlamaModel* llama = model_->llama();
  SPECULA_CHECK(llama != nullptr, "{} is not a Llama-family model (it uses multi-head latent attention)",
                config().architecture);
  return *llama;
}

void ModelRunner::copy_kv_slots(std::span<const int32_t> src, std::span<const int32_t> dst) {
  if (model_->owns_kv_cache()) {
    model_->copy_kv_slots(src, dst);
  } else {
    kv_pool().copy_slots(src, dst, cuda_stream());
  }
}

MHAKVPool& ModelRunner::kv_pool() {
  SPECULA_CHECK(!model_->owns_kv_cache(), "under tensor parallelism each GPU holds its own shard of the KV cache");
  SPECULA_CHECK(kv_pool_ != nullptr, "{} keeps a latent (MLA) KV cache, not a per-head one", config().architecture);
  return *kv_pool_;
}

AttentionBackend& ModelRunner::backend() {
  AttentionBackend* backend = model_->attention_backend();
  SPECULA_CHECK(backend != nullptr, "{} does not attend through a per-head attention backend", config().architecture);
  return *backend;
}

void ModelRunner::capture_verify_graphs(const std::vector<int>& capture_layers, const std::vector<int>& num_draft_tokens) {
  if (graph_setup_.batch_sizes.empty() || options_.cuda_graph_verify_tokens == 0) return;
  std::vector<int> tokens;
  for (int n : num_draft_tokens) {
    SPECULA_CHECK(n >= 1 && n <= options_.cuda_graph_verify_tokens,
                  "verify graphs of {} tokens per request: the runner was sized for 1..{}", n,
                  options_.cuda_graph_verify_tokens);
    tokens.push_back(n);
  }
  model_->capture_verify_graphs(graph_setup_, tokens, capture_layers);
}

ModelRunner::~ModelRunner() = default;

namespace {
// The CPU models' greedy tokens, from their host logits, over the tokens token_bitmask allows
// where it is given (greedy_token's order: the lowest index of the largest value, NaN never).
void greedy_rows(const std::vector<float>& logits, int vocab, std::vector<int32_t>& ids,
                 const TokenBitmaskFill& token_bitmask) {
  const size_t rows = logits.size() / static_cast<size_t>(vocab);
  const size_t width = static_cast<size_t>(vocab);
  ids.resize(rows);
  if (!token_bitmask) {
    for (size_t r = 0; r < rows; ++r) ids[r] = greedy_token(std::span<const float>(logits).subspan(r * width, width));
    return;
  }
  const size_t words = (width + 31) / 32;
  std::vector<uint32_t> allowed(rows * words);
  token_bitmask(allowed);
  for (size_t r = 0; r < rows; ++r) {
    float best = -INFINITY;
    int32_t index = -1;
    for (size_t i = 0; i < width; ++i) {
      const float v = logits[r * width + i];
      if ((allowed[r * words + i / 32] >> (i % 32) & 1u) != 0 && v > best) {
        best = v;
        index = static_cast<int32_t>(i);
      }
    }
    ids[r] = index;
  }
}
}  // namespace

void ModelRunner::forward(ForwardBatch& batch, std::vector<float>& logits, bool all_tokens, HiddenCapture* capture,
                          std::vector<int32_t>* greedy_ids, const TokenBitmaskFill& token_bitmask,
                          const std::function<void()>& host_work) {
  batch.req_to_token_pool = req_pool_.get();
  batch.token_to_kv_pool = kv_pool_.get();
  batch.mla_kv_pool = mla_kv_pool_.get();
  SPECULA_CHECK(batch.spec_info == nullptr || batch.spec_info->device_tree_tokens == nullptr ||
                    (model_->on_gpu() && (kv_pool_ != nullptr || model_->owns_kv_cache())),
                "{}: a verify batch whose tree tokens are on the GPU needs a Llama-family model on the GPU",
                config().architecture);
  SPECULA_CHECK(capture == nullptr || capture->download || model_->on_gpu(),
                "{}: hidden states kept on the device need a model on the GPU", config().architecture);
  SPECULA_ASSERT(!token_bitmask || greedy_ids != nullptr);
  ForwardRequest request;
  request.all_tokens = all_tokens;
  request.capture = capture;
  request.greedy_ids = greedy_ids;
  request.token_bitmask = token_bitmask;
  request.use_cuda_graph = use_cuda_graph_;
  if (model_->on_gpu()) request.host_work = host_work;
  model_->forward(batch, logits, request);
  if (model_->on_gpu()) return;
  if (host_work) host_work();
  if (greedy_ids != nullptr) greedy_rows(logits, config().vocab_size, *greedy_ids, token_bitmask);
}

}  // namespace specula
