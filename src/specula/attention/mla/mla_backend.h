// The MLA attention backend interface (SGLang's MLA backends: FlashMLA, FlashInfer-MLA,
// CUTLASS-MLA; vLLM's FlashMLA-sparse) and its registry.
//
// Attention runs in the absorbed form over the latent cache (MLAKVPool): the model folds W_UK
// into the query, so each query head is [kv_lora_rank + qk_rope_head_dim] (q_nope W_UK, then
// q_pe) and every head attends to one shared KV head, the cached latent row (the key is the
// whole row, the value its first kv_lora_rank values). The output stays in latent space
// [kv_lora_rank]; the model applies W_UV.
//
// Every forward mode goes through forward():
//   DECODE: one query per request over its seq_lens[i] keys.
//   EXTEND / MIXED / DRAFT_EXTEND: extend_seq_lens[i] queries after extend_prefix_lens[i] cached
//     tokens, causal (query j sees keys [0, prefix + j]). The prefix is processed in chunks of at
//     most prefix_chunk_tokens keys per request, each chunk merged with merge_state (SGLang's
//     chunked prefix cache), so no step holds more than a chunk of prefix state.
//   TARGET_VERIFY: spec_info->num_draft_tokens queries after seq_lens[i] keys, causal among
//     themselves (MTP, chains) or under spec_info->custom_mask (EAGLE trees).
// EXTEND and MIXED steps may instead run in the expanded form (forward_expanded, SGLang's MHA path
// for DeepSeek prefill): per-head keys [k_nope ; k_pe] and values, expanded from the cached latent
// rows through the model's kv_b_proj, attended by an MHA kernel at width qk_nope + rope against
// v_head_dim. Per (query, key) pair it costs 2 x (qk_nope + rope + v_head_dim) FLOPs per head
// instead of 2 x (2 kv_lora_rank + rope), 3.4x fewer at DeepSeek's widths, plus one kv_b_proj
// product per cached row; init_forward_metadata chooses the form per step (MlaExtendForm).
// Sparse MLA (DeepSeek-V3.2): with options.topk_indices each query token attends only to the
// listed request-relative positions (-1 entries pad); masks and causality are then the indexer's
// business and are not applied again.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "specula/batch/forward_batch.h"
#include "specula/core/tensor.h"
#include "specula/kv/mla_kv_pool.h"

namespace specula {

class ThreadPool;

struct MlaLayer {
  int layer_id = 0;
  int num_q_heads = 0;
  int kv_lora_rank = 512;
  int qk_rope_head_dim = 64;
  // The per-head widths of the expanded form (forward_expanded): keys qk_nope_head_dim + rope,
  // values v_head_dim.
  int qk_nope_head_dim = 128;
  int v_head_dim = 128;
  // The softmax scale. Required: DeepSeek's is 1/sqrt(qk_nope_head_dim + qk_rope_head_dim) times
  // the YaRN mscale squared, which the absorbed width (kv_lora_rank + rope) does not determine.
  float scaling = 0.0f;
  // Attention sinks: one logit per query head that joins the softmax denominator without
  // contributing a value. [num_q_heads] or empty.
  std::vector<float> sinks;

  int qk_head_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

struct MlaForwardOptions {
  bool save_kv_cache = true;  // write kv_c / k_pe into the pool at out_cache_loc first
  // f32 [num_tokens, num_q_heads]: natural-log sum of exp(scaled scores) per row, sinks included.
  TensorView lse;
  // Sparse MLA: i32 [num_tokens, topk] request-relative key positions per query token; -1 pads,
  // and positions outside [0, kv_len) of the token's request are treated as -1.
  TensorView topk_indices;
};

// How EXTEND and MIXED steps attend: absorbed (forward), expanded (forward_expanded), or
// automatic: whichever the step's shape makes cheaper (expanded when a request's queries are many
// against its cached prefix, e.g. a fresh prompt; absorbed for decode-like steps).
enum class MlaExtendForm : uint8_t { automatic, absorbed, expanded };

std::string_view mla_extend_form_name(MlaExtendForm form);  // "auto", "absorbed", "expanded"
// Throws specula::Error listing the names otherwise.
MlaExtendForm parse_mla_extend_form(std::string_view name);

// The model's kv_b_proj for forward_expanded: from `rows` latent rows, kv_c bf16 [rows,
// kv_lora_rank] and k_pe bf16 [rows, qk_rope_head_dim] (after RoPE, as cached), write k bf16 [rows,
// num_q_heads, qk_nope_head_dim + qk_rope_head_dim] (k_nope, then k_pe for every head) and v bf16
// [rows, num_q_heads, v_head_dim]. Device pointers; runs on the backend's stream.
using MlaExpandFn = std::function<void(const void* kv_c, const void* k_pe, int64_t rows, void* k, void* v)>;

struct MlaBackendOptions {
  Device device = Device::cpu();
  int page_size = 64;
  ThreadPool* thread_pool = nullptr;  // CPU; nullptr: the default pool
  void* cuda_stream = nullptr;        // CUDA: the cudaStream_t to run on
  int max_context_len = 0;            // CUDA: sizes graph buffers and split plans
  // Extend: cached-prefix keys per request per chunk; 0: the whole prefix in one chunk.
  int prefix_chunk_tokens = 0;
  MlaExtendForm extend_form = MlaExtendForm::automatic;  // CUDA; the CPU backend is absorbed only
  // Expanded form: cached rows expanded at once (all requests together); each pass is merged with
  // merge_state. 0: as many as fit 512 MiB of expanded keys and values.
  int64_t expanded_chunk_rows = 0;
};

class MlaAttentionBackend {
 public:
  virtual ~MlaAttentionBackend() = default;
  virtual std::string_view name() const = 0;

  // Throws specula::Error naming what the layer asks for and what is supported. Start-up only.
  virtual void check_layer(const MlaLayer& layer, DType q_dtype, MlaKVFormat kv_format) const = 0;

  // Once per step: page table, per-request lengths, prefix chunks, split plans. The batch must
  // point at its pool (batch.mla_kv_pool).
  virtual void init_forward_metadata(const ForwardBatch& batch) = 0;

  // q [num_tokens, num_q_heads, kv_lora_rank + qk_rope_head_dim] (f32, bf16 or f16 on the CPU;
  // bf16 on CUDA); kv_c [num_tokens, kv_lora_rank] and k_pe [num_tokens, qk_rope_head_dim], the
  // new tokens' latent rows (ignored when !save_kv_cache); out [num_tokens, num_q_heads,
  // kv_lora_rank], q's dtype. A query with no visible key (only possible with sparse indices that
  // are all -1) outputs zeros with lse -inf (or the sink's contribution only).
  virtual void forward(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe, const TensorView& out,
                       const MlaLayer& layer, const ForwardBatch& batch, const MlaForwardOptions& options) = 0;

  // Whether init_forward_metadata chose the expanded form for this step: the model then calls
  // forward_expanded instead of forward for every layer.
  virtual bool expanded_step() const { return false; }

  // The expanded form of EXTEND / MIXED: q bf16 [num_tokens, num_q_heads, qk_nope_head_dim +
  // qk_rope_head_dim] (q_nope, then q_pe after RoPE); kv_c, k_pe as forward's (written first when
  // save_kv_cache); out bf16 [num_tokens, num_q_heads, v_head_dim], values already in head space
  // (no W_UV); options.lse as forward's; no topk_indices. Attends over the cached rows, through
  // `expand`, in passes of at most expanded_chunk_rows rows. Throws where expanded_step() is false.
  virtual void forward_expanded(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe,
                                const TensorView& out, const MlaLayer& layer, const ForwardBatch& batch,
                                const MlaExpandFn& expand, const MlaForwardOptions& options);

  // The lightning indexer (DeepSeek-V3.2) that chooses sparse MLA's keys. Writes index_k
  // [num_tokens, index_head_dim] (the new tokens' indexer keys) into the pool at out_cache_loc
  // when save_index_k, then for each query token t at KV position p_t (its request's kv_len -
  // query_len + its index among the request's queries) scores every position j <= p_t:
  //   score[t][j] = sum_h weights[t][h] * relu(q[t][h] . k_j),
  // k_j the pool's dequantised indexer key of layer.layer_id. out[t] lists the topk best j, best
  // first, ties to the lower j, padded with -1 past p_t + 1 entries.
  // q [num_tokens, n_heads, index_head_dim] (f32 or bf16; bf16 on CUDA); weights f32 [num_tokens,
  // n_heads]; out i32 [num_tokens, topk].
  virtual void indexer_topk(const TensorView& q, const TensorView& weights, const TensorView& index_k,
                            const MlaLayer& layer, const ForwardBatch& batch, const TensorView& out,
                            bool save_index_k) = 0;

  // CUDA-graph hooks, as AttentionBackend's; backends without graphs throw naming themselves.
  virtual void init_cuda_graph_state(int max_bs, int max_num_tokens);
  virtual void init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch);
  virtual void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch);
};

// Why a layer is malformed for any MLA backend (head counts, sinks, scale), or "".
std::string common_mla_layer_problem(const MlaLayer& layer);

// "cpu", and "cuda" in CUDA builds; anything else throws listing the names.
std::unique_ptr<MlaAttentionBackend> make_mla_backend(std::string_view name, const MlaBackendOptions& options);
std::vector<std::string> mla_backend_names();

}  // namespace specula
