// make_cuda_model: the GPU implementations of Model (LlamaCudaModel, DeepseekCudaModel).
#include "specula/model/cuda_models.h"

#include "specula/core/error.h"
#include "specula/model/deepseek_cuda.h"
#include "specula/model/llama_cuda.h"

namespace specula {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& config, const WeightSource& weights,
                                       const ModelOptions& options) {
  // Refused before any weight is read: the GPU has no fused MoE kernels yet (issue 53).
  SPECULA_CHECK(!config.has_moe(),
                "{}: mixture-of-experts layers (n_routed_experts {}) run on the CPU only in this build; use --device cpu",
                config.architecture, config.moe.n_routed_experts);
  if (config.is_mla()) return std::make_unique<DeepseekCudaModel>(std::make_unique<DeepseekModel>(config, weights), options);
  return std::make_unique<LlamaCudaModel>(std::make_unique<LlamaModel>(config, weights), options);
}

}  // namespace specula
