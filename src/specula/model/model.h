// Model: the one interface every target model implements (the Llama family and DeepSeek's MLA
// models, on the CPU and on a GPU), so the model runner never asks which one it holds. A Model
// owns its weights as its executor holds them and the attention backend its layers attend
// through (created on the model's stream); the runner owns the request table and the KV pools
// and points each batch at them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/mla/mla_backend.h"
#include "specula/batch/forward_batch.h"
#include "specula/core/device.h"
#include "specula/core/dtype.h"
#include "specula/model/config.h"
#include "specula/model/hidden_capture.h"
#include "specula/model/weights.h"

namespace specula {

class LlamaModel;
class MHAKVPool;
class TpComm;
struct KVPoolConfig;
class MLAKVPool;
class ReqToTokenPool;

// Structured output's allowed tokens for greedy rows: fills words ([rows, ceil(vocab / 32)], token
// id i of a row at bit i % 32 of its word i / 32). A GPU model calls it once the step's work is
// queued and before it waits for the results, so the host computes the masks while the device
// runs the forward.
using TokenBitmaskFill = std::function<void(std::span<uint32_t> words)>;

// What one forward returns besides the logits.
struct ForwardRequest {
  // f32 logits of every token ([num_tokens, vocab]) instead of each request's last one.
  bool all_tokens = false;
  // Hidden states of every token for a draft head (optional; Llama-family models only).
  HiddenCapture* capture = nullptr;
  // Each returned row's greedy token (runner/sampler.h's greedy_token, -1 for a row with nothing
  // above -inf) instead of the logits: GPU models find them on the device, download only the ids
  // and leave logits as it was; CPU models fill logits too.
  std::vector<int32_t>* greedy_ids = nullptr;
  // With greedy_ids (optional): fills the tokens each returned row may pick (TokenBitmaskFill);
  // its row's greedy token is then the argmax over those alone, -1 where none is above -inf.
  TokenBitmaskFill token_bitmask;
  // Host work that needs none of the step's results (optional; e.g. sampled rows' grammar masks):
  // GPU models call it once the step is queued and before they wait for it, so the two overlap;
  // CPU models after the forward. Called at most once, on the calling thread.
  std::function<void()> host_work;
  // Replay captured CUDA graphs where one holds the batch (benchmarks compare both).
  bool use_cuda_graph = true;
};

// Where CUDA-graph padding rows point: a request row and KV slots set aside for them (one token
// for decode, the tree after it for verify), and the pools the captured steps run over.
struct GraphSetup {
  std::vector<int> batch_sizes;  // each >= 1
  int32_t padding_req_row = -1;
  int32_t padding_slot = -1;
  ReqToTokenPool* req_pool = nullptr;
  MHAKVPool* kv_pool = nullptr;      // Llama-family models
  MLAKVPool* mla_kv_pool = nullptr;  // MLA models
};

struct ModelOptions {
  Device device = Device::cpu();
  std::string attention_backend;  // "cpu", "cuda", ... (make_attention_backend / make_mla_backend)
  int page_size = 16;
  int max_kv_len = 0;  // the longest KV a request row maps (context plus speculative scratch)
  DType kv_dtype = DType::f32;
  bool deterministic = false;
  MlaExtendForm mla_extend_form = MlaExtendForm::automatic;
  bool fp8_experts = false;  // RunnerOptions::fp8_experts
  // Set: Llama-family attention is wrapped in double sparsity with these channels.
  std::shared_ptr<const DoubleSparsityConfig> double_sparsity;
  // Tensor parallelism over this many GPUs (cuda:0 .. cuda:tp_size-1; model/tp_model.h).
  int tp_size = 1;
  // Set by the tensor-parallel model for each rank's own model (whose config and weights are
  // already the rank's shard): its communicator and the lm_head rows [vocab_begin, vocab_end) it
  // holds (0, 0: all).
  TpComm* tp_comm = nullptr;
  int64_t vocab_begin = 0, vocab_end = 0;
  // The model's stream does not synchronise with the legacy stream (ranks sharing one GPU in
  // tests: SPECULA_TP_ONE_DEVICE, model/tp_model.h).
  bool nonblocking_stream = false;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  // Bytes of weights as the executor holds them.
  virtual size_t weight_bytes() const = 0;
  // Of which one single-token decode step reads: all of them, except that a mixture-of-experts
  // layer reads its top-k and shared experts only.
  virtual size_t decode_weight_bytes() const { return weight_bytes(); }
  // Of which the most loaded GPU holds (tensor parallelism: each GPU streams its shard).
  virtual size_t decode_weight_bytes_per_gpu() const { return decode_weight_bytes(); }
  // The cudaStream_t the model runs on (nullptr on the CPU); KV pool operations go there too.
  virtual void* cuda_stream() const { return nullptr; }
  // The backend of a Llama-family model / of an MLA model (the other one is nullptr).
  virtual AttentionBackend* attention_backend() { return nullptr; }
  virtual MlaAttentionBackend* mla_backend() { return nullptr; }
  // The Llama-family weights on the host (what an EAGLE head shares: embedding, lm_head), or
  // nullptr.
  virtual const LlamaModel* llama() const { return nullptr; }
  // Whether hidden states can stay on the device (HiddenCapture::download = false).
  virtual bool on_gpu() const { return false; }

  // One step over the batch, whose request table and KV pool are set: initialises the backend's
  // metadata for it (or replays a captured graph that holds it) and runs the layers.
  virtual void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request) = 0;

  // CUDA graphs (GPU models; a no-op elsewhere): DECODE steps for each batch size, and
  // TARGET_VERIFY steps of each of num_draft_tokens tree tokens per request (replacing any
  // captured before) that capture the hidden states of capture_layers. max_tokens: the most
  // tokens one captured step holds.
  virtual void capture_decode_graphs(const GraphSetup& setup, int max_tokens) { (void)setup, (void)max_tokens; }
  virtual void capture_verify_graphs(const GraphSetup& setup, const std::vector<int>& num_draft_tokens,
                                     const std::vector<int>& capture_layers) {
    (void)setup, (void)num_draft_tokens, (void)capture_layers;
  }
  // Batch sizes with a captured decode graph.
  virtual std::vector<int> graph_batch_sizes() const { return {}; }

  // Tensor parallelism: the model keeps its KV cache itself, a shard on each GPU (the runner
  // allocates none and batches run with token_to_kv_pool unset); create_kv_cache sizes it, with
  // `full` as the runner would have made it (all KV heads).
  virtual bool owns_kv_cache() const { return false; }
  virtual void create_kv_cache(const KVPoolConfig& full) { (void)full; }
  // The same for a latent (MLA) cache, which every GPU holds whole.
  virtual void create_mla_kv_cache(const MLAKVPoolConfig& full) { (void)full; }
  // Copies every layer's K and V from slot src[i] to dst[i] in each shard of the cache the model
  // owns (speculative decoding moves accepted paths into place), ordered after the model's work.
  virtual void copy_kv_slots(std::span<const int32_t> src, std::span<const int32_t> dst) { (void)src, (void)dst; }
};

// The KV row format of an MLA model's cache dtype: bf16, or fp8_e4m3 for the 656-byte fp8_ds_mla rows.
MlaKVFormat mla_kv_format(DType kv_dtype);
class DeepseekModel;
// A model's attention backend on `stream` (a cudaStream_t, or nullptr), checked against each of
// its layers.
std::unique_ptr<AttentionBackend> make_llama_backend(const LlamaModel& model, const ModelOptions& options, void* stream);
std::unique_ptr<MlaAttentionBackend> make_deepseek_backend(const DeepseekModel& model, const ModelOptions& options,
                                                           void* stream);

// The model of a checkpoint on options.device: a Llama-family decoder or an MLA model
// (config.is_mla()), its attention backend checked against every layer (an unsupported shape
// fails here, naming both sides).
std::unique_ptr<Model> make_model(const ModelConfig& config, const WeightSource& weights, const ModelOptions& options);

}  // namespace specula
