// AttentionBackend's shared pieces: forward() dispatch, the default draft-tree and CUDA-graph hooks,
// and the registry of built-in backends (an explicit list: no static-initialisation tricks that a
// static library link could silently drop).
#include "specula/attention/backend.h"

#include <memory>
#include <string>
#include <vector>
#include <cmath>

#include "specula/attention/cpu/cpu_backend.h"
#include "specula/attention/double_sparsity/ds_backend.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/attention/cuda/cuda_backend.h"
#endif
#include "specula/attention/hybrid_backend.h"
#include "specula/core/error.h"

namespace specula {

float AttentionLayer::effective_scaling() const {
  return scaling != 0.0f ? scaling : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::string common_layer_problem(const AttentionLayer& layer) {
  if (layer.num_q_heads < 1 || layer.num_kv_heads < 1 || layer.num_q_heads % layer.num_kv_heads != 0) {
    return fmt::format("num_q_heads {} must be a positive multiple of num_kv_heads {}", layer.num_q_heads,
                       layer.num_kv_heads);
  }
  if (!layer.sinks.empty() && static_cast<int>(layer.sinks.size()) != layer.num_q_heads) {
    return fmt::format("sinks has {} entries; expected one per query head ({})", layer.sinks.size(), layer.num_q_heads);
  }
  if (layer.sliding_window_size < -1) {
    return fmt::format("sliding_window_size {} is not valid; expected -1 (none) or >= 0", layer.sliding_window_size);
  }
  if (!(layer.logit_cap >= 0.0f)) return fmt::format("logit_cap {} must be >= 0", layer.logit_cap);
  if (layer.dca_chunk_len < 0) return fmt::format("dca_chunk_len {} must be >= 0", layer.dca_chunk_len);
  if (const DualChunkSparsePattern* s = layer.dca_sparse.get(); s != nullptr) {
    if (layer.dca_chunk_len == 0) return "a sparse prefill pattern needs dual chunk attention (dca_chunk_len > 0)";
    if (static_cast<int>(s->vertical.size()) != layer.num_q_heads || static_cast<int>(s->slash.size()) != layer.num_q_heads) {
      return fmt::format("the sparse prefill pattern has {} vertical and {} slash sizes; expected one per query head ({})",
                         s->vertical.size(), s->slash.size(), layer.num_q_heads);
    }
    if (s->threshold < 0) return fmt::format("sparse prefill threshold {} must be >= 0", s->threshold);
    if (s->last_q < 1) return fmt::format("sparse prefill last_q {} must be >= 1", s->last_q);
    if (s->forced_vertical < 0) return fmt::format("sparse prefill forced_vertical {} must be >= 0", s->forced_vertical);
    // Distance 0 ranks first, so every row keeps its own key and no softmax is empty.
    if (s->forced_slash < 1) return fmt::format("sparse prefill forced_slash {} must be >= 1", s->forced_slash);
    for (int h = 0; h < layer.num_q_heads; ++h) {
      if (s->vertical[static_cast<size_t>(h)] < 0 || s->slash[static_cast<size_t>(h)] < 1) {
        return fmt::format("query head {} keeps {} vertical and {} slash lines; expected >= 0 and >= 1 (a row keeps "
                           "at least its own key)",
                           h, s->vertical[static_cast<size_t>(h)], s->slash[static_cast<size_t>(h)]);
      }
    }
  }
  return {};
}

void AttentionBackend::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const AttentionLayer& layer,
                               const ForwardBatch& batch, const ForwardOptions& options) {
  switch (batch.forward_mode) {
    case ForwardMode::IDLE: return;
    case ForwardMode::DECODE: forward_decode(q, k, v, out, layer, batch, options); return;
    default: forward_extend(q, k, v, out, layer, batch, options); return;
  }
}

void AttentionBackend::forward_draft_tree(const TensorView&, const TensorView&, const AttentionLayer&, MHAKVPool&,
                                          const DraftTreeView&) {
  SPECULA_CHECK(false, "attention backend '{}' does not support forward_draft_tree (draft tree steps on the GPU); "
                "the cuda backend does", name());
}

void AttentionBackend::init_cuda_graph_state(int, int) {
  SPECULA_CHECK(false, "attention backend '{}' does not support CUDA graphs", name());
}
void AttentionBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch&) {
  SPECULA_CHECK(false, "attention backend '{}' does not support CUDA graphs", name());
}
void AttentionBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch&) {
  SPECULA_CHECK(false, "attention backend '{}' does not support CUDA graphs", name());
}

std::vector<std::string> attention_backend_names() {
#ifdef SPECULA_HAS_CUDA
  return {"cpu", "cuda", "hybrid"};
#else
  return {"cpu", "hybrid"};
#endif
}

std::unique_ptr<AttentionBackend> make_attention_backend(std::string_view name,
                                                         const AttentionBackendOptions& options) {
  if (options.double_sparsity) {
    AttentionBackendOptions dense = options;
    dense.double_sparsity.reset();
    return std::make_unique<DoubleSparsityBackend>(make_attention_backend(name, dense), options.double_sparsity,
                                                   options);
  }
  if (name == "cpu") return std::make_unique<CpuAttentionBackend>(options);
#ifdef SPECULA_HAS_CUDA
  if (name == "cuda") return std::make_unique<CudaAttentionBackend>(options);
#endif
  if (name == "hybrid") {
    SPECULA_CHECK(options.prefill_backend != "hybrid" && options.decode_backend != "hybrid",
                  "a hybrid backend cannot contain another hybrid backend");
    return std::make_unique<HybridAttentionBackend>(make_attention_backend(options.prefill_backend, options),
                                                    make_attention_backend(options.decode_backend, options),
                                                    options.speculative_attention_mode);
  }
  SPECULA_CHECK(false, "attention backend '{}' is not known; known: {}", name,
                fmt::join(attention_backend_names(), ", "));
  return nullptr;
}

}  // namespace specula
