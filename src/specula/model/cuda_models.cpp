// make_cuda_model: the GPU implementations of Model (LlamaCudaModel, DeepseekCudaModel).
#include "specula/model/cuda_models.h"

#include "specula/model/deepseek_cuda.h"
#include "specula/model/llama_cuda.h"

namespace specula {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& config, const WeightSource& weights,
                                       const ModelOptions& options) {
  if (config.is_mla()) return std::make_unique<DeepseekCudaModel>(std::make_unique<DeepseekModel>(config, weights), options);
  return std::make_unique<LlamaCudaModel>(std::make_unique<LlamaModel>(config, weights), options);
}

}  // namespace specula
