// ModelRunner (SGLang's model_executor.ModelRunner): owns one Model (which holds its weights and
// its attention backend) and everything else a step needs besides the batch itself: the request
// table (ReqToTokenPool), the paged KV allocator, the KV pool and the CUDA-graph padding row. The
// scheduler fills a ForwardBatch with request slots and KV slots from these pools and calls
// forward().
// The model is a Model (model/model.h); its kind only decides the KV pool: Llama-family decoders
// attend over an MHAKVPool, DeepSeek's multi-head latent attention models (config.is_mla()) over
// an MLAKVPool whose format follows kv_dtype (bf16, or fp8_e4m3 for the 656-byte fp8_ds_mla rows).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/mla/mla_backend.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/attention/double_sparsity/ds_config.h"
#include "specula/kv/mla_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/kv/token_allocator.h"
#include "specula/model/llama.h"
#include "specula/model/model.h"
#include "specula/model/weights.h"

namespace specula {

struct ModelRunnerOptions {
  Device device = Device::cpu();
  std::string attention_backend;  // empty: "cpu" on the CPU, "cuda" on a GPU
  int page_size = 16;
  std::optional<DType> kv_dtype;  // unset: f32 on the CPU, bf16 on a GPU; MLA models: bf16
  int max_context_len = 0;        // 0: the model's max_position_embeddings, at most 8192
  int max_running_requests = 64;  // rows of the request table
  // KV cache size in tokens; 0: enough for max_running_requests full contexts, at most
  // kv_cache_memory_gib of KV, and never less than one full context.
  int64_t kv_cache_tokens = 0;
  double kv_cache_memory_gib = 4.0;
  // CUDA graphs for DECODE steps (GPU only): captured at start-up for these batch sizes (empty:
  // 1, 2, 4, 8, then every 8 up to cuda_graph_max_bs); a batch runs in the smallest graph that
  // holds it, padded; larger batches run eagerly.
  bool cuda_graph = true;
  // Batch-invariant execution (SGLang's --enable-deterministic-inference): a request's logits do
  // not depend on the other requests of its batch. Slower GPU prefill. Llama-family models only.
  bool deterministic = false;
  int cuda_graph_max_bs = 64;
  std::vector<int> cuda_graph_batch_sizes;
  // Speculative decoding: tree tokens per request of TARGET_VERIFY steps (0: none). With graphs,
  // the backend's graph buffers and the padding rows are sized for it, and capture_verify_graphs
  // records verify graphs for the same batch sizes.
  int cuda_graph_verify_tokens = 0;
  // Speculative decoding: KV slots a cycle uses past a request's last token (draft scratch and
  // the verify tree). Request rows and attention plans hold max_context_len + this many, so a
  // request near the end of its context still gets whole cycles and all of its output tokens.
  int spec_scratch_tokens = 0;
  // MLA models on a GPU: how extend steps attend (MlaExtendForm: auto, absorbed or expanded).
  MlaExtendForm mla_extend_form = MlaExtendForm::automatic;
  // An fp8 block-scaled checkpoint on a GPU: keep its experts in fp8 (half their memory; the
  // grouped GEMMs are slower than over bf16 in this build) instead of dequantizing them to bf16.
  bool fp8_experts = false;
  // Double sparsity (SGLang's --enable-double-sparsity): long requests decode over heavy tokens
  // chosen from label channels. Decode steps then run without CUDA graphs.
  DoubleSparsityOptions double_sparsity;
  // Tensor parallelism over GPUs cuda:0 .. cuda:tp_size-1 (SGLang's --tp-size; model/tp_model.h).
  // Each GPU holds its shard of the KV cache, sized by kv_cache_memory_gib per GPU.
  int tp_size = 1;
};

class ModelRunner {
 public:
  // The checkpoint's model (make_model) on options.device.
  ModelRunner(const ModelConfig& config, const WeightSource& weights, const ModelRunnerOptions& options);
  // A model built elsewhere (tests' fake models); the pools are sized from model->config().
  ModelRunner(std::unique_ptr<Model> model, const ModelRunnerOptions& options);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  const ModelConfig& config() const { return model_->config(); }
  const ModelRunnerOptions& options() const { return options_; }
  Model& model() { return *model_; }
  // The Llama-family host model (what an EAGLE head shares); throws specula::Error for others.
  const LlamaModel& llama_model() const;
  // The longest prompt + output of one request.
  int max_context_len() const { return options_.max_context_len; }
  // The longest KV a request row maps: the context plus a speculative cycle's scratch.
  int kv_capacity() const { return options_.max_context_len + options_.spec_scratch_tokens; }
  int page_size() const { return options_.page_size; }

  ReqToTokenPool& req_pool() { return *req_pool_; }
  PagedTokenAllocator& allocator() { return *allocator_; }
  // Copies every layer's K and V from slot src[i] to slot dst[i], in order (speculative decoding
  // moves accepted paths into place): in the pool, or in every GPU's shard of it.
  void copy_kv_slots(std::span<const int32_t> src, std::span<const int32_t> dst);
  // The pool and backend of Llama-family models on one device; throw specula::Error for MLA
  // models and under tensor parallelism (each GPU holds its own shard of the cache).
  MHAKVPool& kv_pool();
  AttentionBackend& backend();
  // MLA models only (nullptr otherwise).
  MLAKVPool* mla_kv_pool() { return mla_kv_pool_.get(); }
  // Bytes of weights as the executor holds them (f32 on the CPU; bf16 matrices on a GPU when the
  // checkpoint is bf16): what one decode step must read.
  size_t weight_bytes() const { return model_->weight_bytes(); }
  size_t decode_weight_bytes() const { return model_->decode_weight_bytes(); }
  // Batch sizes with a captured decode graph (empty on the CPU or with graphs off).
  std::vector<int> cuda_graph_batch_sizes() const { return model_->graph_batch_sizes(); }
  // The cudaStream_t the GPU model runs on (nullptr on the CPU); KV pool operations go there too.
  void* cuda_stream() const { return model_->cuda_stream(); }
  // The KV slot CUDA-graph padding rows write (-1 without graphs); a draft pool that shares the
  // slot numbering may let its padding rows write it too.
  int32_t cuda_graph_padding_slot() const { return graph_setup_.padding_slot; }
  // Records TARGET_VERIFY graphs for each of num_draft_tokens tree tokens per request (at most
  // options().cuda_graph_verify_tokens) that capture the hidden states of capture_layers; a no-op
  // without decode graphs.
  void capture_verify_graphs(const std::vector<int>& capture_layers, const std::vector<int>& num_draft_tokens);
  // Turns the replay of captured graphs off and on (benchmarks compare both).
  void set_use_cuda_graph(bool use) { use_cuda_graph_ = use; }

  // Points the batch at the pools and runs the model (Model::forward): f32 logits of the last
  // token of each request ([batch_size, vocab]), or of every token with all_tokens.
  // capture (optional): hidden states of every token for a draft head. greedy_ids (optional):
  // each returned row's greedy token (greedy_token in runner/sampler.h, -1 when a row holds
  // nothing above -inf) instead of the logits; GPU models find them on the device, download only
  // the ids and leave logits as it was, CPU models fill logits too. token_bitmask (optional, with
  // greedy_ids): the tokens each row may pick (model.h's TokenBitmaskFill). host_work (optional):
  // host work that overlaps a GPU model's step (ForwardRequest::host_work; after a CPU model's).
  void forward(ForwardBatch& batch, std::vector<float>& logits, bool all_tokens = false,
               HiddenCapture* capture = nullptr, std::vector<int32_t>* greedy_ids = nullptr,
               const TokenBitmaskFill& token_bitmask = {}, const std::function<void()>& host_work = {});

 private:
  // Checks and completes the options against the model, sizes the pools, captures decode graphs.
  void init(const ModelConfig& config, const std::function<std::unique_ptr<Model>(const ModelOptions&)>& make);

  ModelRunnerOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ReqToTokenPool> req_pool_;
  std::unique_ptr<PagedTokenAllocator> allocator_;
  std::unique_ptr<MHAKVPool> kv_pool_;
  std::unique_ptr<MLAKVPool> mla_kv_pool_;
  GraphSetup graph_setup_;  // the padding row and slot of CUDA graphs (padding_slot -1 without)
  bool use_cuda_graph_ = true;
};

}  // namespace specula
