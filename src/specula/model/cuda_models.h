// make_cuda_model: the Model of a checkpoint on a GPU (LlamaCudaModel or DeepseekCudaModel), kept
// apart so that CPU-only builds of model.cpp need no CUDA header.
#pragma once

#include <memory>

#include "specula/model/model.h"

namespace specula {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& config, const WeightSource& weights,
                                       const ModelOptions& options);

}  // namespace specula
