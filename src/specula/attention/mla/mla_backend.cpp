// MlaAttentionBackend's shared pieces: layer checks, the default CUDA-graph hooks and the
// registry (an explicit list, as attention/backend.cpp keeps).
#include "specula/attention/mla/mla_backend.h"

#include <cmath>

#include "specula/attention/mla/cpu/cpu_mla_backend.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/attention/mla/cuda/cuda_mla_backend.h"
#endif
#include "specula/core/error.h"

namespace specula {

std::string common_mla_layer_problem(const MlaLayer& layer) {
  if (layer.num_q_heads < 1) return fmt::format("num_q_heads {} must be >= 1", layer.num_q_heads);
  if (layer.kv_lora_rank < 1 || layer.qk_rope_head_dim < 0) {
    return fmt::format("kv_lora_rank {} must be >= 1 and qk_rope_head_dim {} >= 0", layer.kv_lora_rank,
                       layer.qk_rope_head_dim);
  }
  if (!(std::isfinite(layer.scaling) && layer.scaling > 0.0f)) {
    return fmt::format("scaling {} must be finite and > 0 (MLA layers state their softmax scale)", layer.scaling);
  }
  if (!layer.sinks.empty() && static_cast<int>(layer.sinks.size()) != layer.num_q_heads) {
    return fmt::format("sinks has {} entries; expected one per query head ({})", layer.sinks.size(), layer.num_q_heads);
  }
  return {};
}

std::string_view mla_extend_form_name(MlaExtendForm form) {
  switch (form) {
    case MlaExtendForm::automatic: return "auto";
    case MlaExtendForm::absorbed: return "absorbed";
    case MlaExtendForm::expanded: return "expanded";
  }
  return "?";
}

MlaExtendForm parse_mla_extend_form(std::string_view name) {
  for (MlaExtendForm f : {MlaExtendForm::automatic, MlaExtendForm::absorbed, MlaExtendForm::expanded}) {
    if (name == mla_extend_form_name(f)) return f;
  }
  SPECULA_CHECK(false, "MLA extend form '{}' is not known; known: auto, absorbed, expanded", name);
  return MlaExtendForm::automatic;
}

void MlaAttentionBackend::forward_expanded(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                                           const MlaLayer&, const ForwardBatch&, const MlaExpandFn&,
                                           const MlaForwardOptions&) {
  SPECULA_CHECK(false, "MLA backend '{}' did not choose the expanded form for this step", name());
}

void MlaAttentionBackend::init_cuda_graph_state(int, int) {
  SPECULA_CHECK(false, "MLA backend '{}' does not support CUDA graphs", name());
}
void MlaAttentionBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch&) {
  SPECULA_CHECK(false, "MLA backend '{}' does not support CUDA graphs", name());
}
void MlaAttentionBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch&) {
  SPECULA_CHECK(false, "MLA backend '{}' does not support CUDA graphs", name());
}

std::vector<std::string> mla_backend_names() {
#ifdef SPECULA_HAS_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

std::unique_ptr<MlaAttentionBackend> make_mla_backend(std::string_view name, const MlaBackendOptions& options) {
  if (name == "cpu") return std::make_unique<CpuMlaBackend>(options);
#ifdef SPECULA_HAS_CUDA
  if (name == "cuda") return std::make_unique<CudaMlaBackend>(options);
#endif
  SPECULA_CHECK(false, "MLA backend '{}' is not known; known: {}", name, fmt::join(mla_backend_names(), ", "));
  return nullptr;
}

}  // namespace specula
