// The GPU implementations of Model (LlamaCuda, DeepseekCuda): the host model, its CUDA executor
// and the attention backend on the executor's stream, with graph replay where a graph holds the
// batch.
#pragma once

#include <memory>

#include "specula/model/model.h"

namespace specula {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& config, const WeightSource& weights,
                                       const ModelOptions& options);

}  // namespace specula
