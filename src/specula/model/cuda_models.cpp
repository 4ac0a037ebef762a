// make_cuda_model: the GPU implementations of Model (LlamaCudaModel, DeepseekCudaModel).
#include "specula/model/cuda_models.h"

#include "specula/core/error.h"
#include "specula/model/deepseek_cuda.h"
#include "specula/model/llama_cuda.h"

namespace specula {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& config, const WeightSource& weights,
                                       const ModelOptions& options) {
  // The host model holds no routed experts: the GPU model reads them one at a time from the
  // checkpoint into its stacked bf16 layout (an f32 host copy of a 16B-parameter MoE is 64 GB).
  if (config.is_mla()) {
    return std::make_unique<DeepseekCudaModel>(std::make_unique<DeepseekModel>(config, weights, false), options, &weights);
  }
  // Nor the layers' matrices: bf16 ones go to the device as they are.
  return std::make_unique<LlamaCudaModel>(std::make_unique<LlamaModel>(config, weights, false, false), options, &weights);
}

}  // namespace specula
