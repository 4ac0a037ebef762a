// The attention backend interface (SGLang's AttentionBackend) and the registry.
//
// A backend is created once per model (make_attention_backend), checks every layer it will
// serve at start-up (check_layer), builds per-step metadata once in init_forward_metadata, and
// then every layer calls forward(). Backends write the layer's new K/V into the KV pool at
// batch.out_cache_loc (unless told not to) and attend over the paged cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "specula/batch/forward_batch.h"
#include "specula/core/tensor.h"

namespace specula {

class MHAKVPool;
class ThreadPool;
struct DoubleSparsityConfig;

// Dual chunk attention's sparse prefill (Qwen2.5-1M's sparse_attention_config, after MInference's
// vertical-and-slash pattern; attention/cpu/dual_chunk_sparse.h): for a sequence of more than
// `threshold` keys, the last `last_q` queries of each chunk's run of new tokens estimate, per query
// head, which key columns (vertical) and which query-key distances (slash) carry the attention,
// and every new token of that run attends only to those keys. Prefill and extend steps only, and
// runs of one token (a decode row in a mixed step) attend densely.
struct DualChunkSparsePattern {
  int threshold = 32768;
  int last_q = 64;
  int forced_vertical = 30;  // the first keys rank first among columns (MInference's sinks)
  int forced_slash = 100;    // and the nearest distances among slashes (the local window)
  std::vector<int32_t> vertical, slash;  // [num_q_heads]: columns and distances kept
};

enum class AttentionType : uint8_t {
  DECODER,       // causal
  ENCODER_ONLY,  // non-causal over the whole sequence (encoders, vision towers)
};

// Per-layer facts (SGLang's RadixAttention fields).
struct AttentionLayer {
  int layer_id = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;        // 0 means head_dim
  float scaling = 0.0f;      // softmax scale; 0 means 1/sqrt(head_dim)
  float logit_cap = 0.0f;    // > 0: scores become logit_cap * tanh(score / logit_cap)
  // window_left: a query at KV index p sees keys j >= p - sliding_window_size; -1: no window.
  int sliding_window_size = -1;
  // Local chunked attention (Llama-4 iRoPE layers): the query sees only keys of its own chunk of
  // the backend's attention_chunk_size tokens.
  bool use_local_attention = false;
  AttentionType attn_type = AttentionType::DECODER;
  // Attention sinks (gpt-oss): one learned logit per query head that joins the softmax
  // denominator without contributing a value. [num_q_heads] or empty.
  std::vector<float> sinks;
  // Dual chunk attention (attention/cpu/dual_chunk.h): > 0 makes q [num_tokens, num_q_heads,
  // 3 * head_dim] (intra, successive and inter rotary variants) and the key chunks this long;
  // dca_original_max_position > 0 scales a long request's logits.
  int dca_chunk_len = 0;
  int dca_original_max_position = 0;
  // Set: prefill rows of long sequences attend sparsely, and q carries two more variants
  // (successive and inter at their unclamped positions) that only estimate the pattern.
  std::shared_ptr<const DualChunkSparsePattern> dca_sparse;
  // How many rotary variants of each query head q holds.
  int dca_q_variants() const { return dca_chunk_len == 0 ? 1 : dca_sparse ? 5 : 3; }

  int effective_v_head_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  float effective_scaling() const;
};

struct ForwardOptions {
  bool save_kv_cache = true;  // write k/v into the pool at out_cache_loc first
  // f32 [num_tokens, num_q_heads]: the natural-log sum of exp(scores) of each output row (sinks
  // included). Left undefined when not wanted.
  TensorView lse;
};

// A draft tree step's rows (EAGLE's draft loop and graphed draft extend), as device arrays:
// row r belongs to sequence r / rows_per_seq; it sees its sequence's paged prefix and its own
// branch of KV slots. Every pointer must stay valid across CUDA-graph replays.
struct DraftTreeView {
  int rows_per_seq = 1;
  const int32_t* prefix_pages = nullptr;  // [num_seqs, page_stride]
  int page_stride = 0;
  const int32_t* prefix_lens = nullptr;   // [num_seqs]
  const int32_t* branch_slots = nullptr;  // [rows, branch_stride]
  int branch_stride = 0;
  int branch_len = 0;                     // used when branch_lens is nullptr
  const int32_t* branch_lens = nullptr;   // [rows] or nullptr
};

struct AttentionBackendOptions {
  Device device = Device::cpu();
  int page_size = 1;
  int attention_chunk_size = 0;       // for layers with use_local_attention
  ThreadPool* thread_pool = nullptr;  // CPU backend; nullptr means the default pool
  // "hybrid": the backend for prefill/extend and the one for decode.
  std::string prefill_backend = "cpu";
  std::string decode_backend = "cpu";
  // "hybrid": which side serves TARGET_VERIFY and DRAFT_EXTEND ("prefill" or "decode").
  std::string speculative_attention_mode = "prefill";
  // "cuda": the cudaStream_t to run on (nullptr: the legacy default stream; CUDA-graph capture
  // needs a real stream) and the longest context a request may have (sizes graph buffers).
  void* cuda_stream = nullptr;
  int max_context_len = 0;
  // Batch-invariant results: a request's attention output does not depend on what else is in the
  // batch (e.g. the CUDA decode split count depends on max_context_len only).
  bool deterministic = false;
  // Set: the named backend is wrapped in a DoubleSparsityBackend with these label channels and
  // settings (sparse decode over heavy tokens for long requests; see double_sparsity/ds_backend.h).
  std::shared_ptr<const DoubleSparsityConfig> double_sparsity;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string_view name() const = 0;

  // Throws specula::Error, listing what the layer asks for and what the backend supports, if
  // this backend cannot serve the layer with these dtypes. Called at start-up for every layer.
  virtual void check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const = 0;

  virtual void init_forward_metadata(const ForwardBatch& batch) = 0;

  // q [num_tokens, num_q_heads, head_dim]; k, v [num_tokens, num_kv_heads, head_dim|v_head_dim]
  // (ignored when !save_kv_cache); out [num_tokens, num_q_heads, v_head_dim].
  virtual void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const AttentionLayer& layer,
                              const ForwardBatch& batch, const ForwardOptions& options) = 0;
  virtual void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const AttentionLayer& layer,
                              const ForwardBatch& batch, const ForwardOptions& options) = 0;
  // Dispatches on batch.forward_mode (IDLE does nothing).
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options = {});

  // Attends q [rows, num_q_heads, head_dim] (its K/V already in the pool) over each row's prefix
  // and branch into out; needs no init_forward_metadata and is graph-capturable. kv_pool: the pool
  // whose layer layer.layer_id holds the keys and values. Backends without it throw specula::Error
  // naming themselves.
  virtual void forward_draft_tree(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                  MHAKVPool& kv_pool, const DraftTreeView& tree);

  // CUDA-graph hooks: fixed buffers allocated once, updated in place before each replay.
  // Backends without graph support throw specula::Error naming themselves.
  virtual void init_cuda_graph_state(int max_bs, int max_num_tokens);
  virtual void init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch);
  virtual void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch);
  virtual int cuda_graph_seq_len_fill_value() const { return 1; }
};

// Checks every backend shares (head counts, sinks, window, soft-cap); returns the reason a layer
// is malformed, or an empty string. Backend selection functions call it first.
std::string common_layer_problem(const AttentionLayer& layer);

// Names: "cpu", "hybrid" (options.prefill_backend + options.decode_backend), and "cuda" in
// CUDA builds. Throws specula::Error listing the known names for anything else.
std::unique_ptr<AttentionBackend> make_attention_backend(std::string_view name,
                                                         const AttentionBackendOptions& options);
std::vector<std::string> attention_backend_names();

}  // namespace specula
