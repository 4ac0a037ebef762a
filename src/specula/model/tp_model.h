// TensorParallelModel: one Llama-family model over tp_size GPUs of this machine (tensor
// parallelism, SGLang's --tp-size). Each rank is an ordinary GPU model (LlamaCudaModel) built
// from its shard of the config and weights (model/tp_shard.h), with the all-reduces after o_proj
// and down_proj (parallel/tp_comm.h) and its part of the lm_head; each has its own stream, KV
// cache shard (its KV heads, the same slots as every other rank) and CUDA graphs.
//
// One worker thread per GPU, in one process: the ranks share the host's request table and the
// batch (nothing is sent to "broadcast" it: each rank's thread reads the same ForwardBatch), peer
// memory is plain pointers once peer access is on (no IPC handles), a rank's failure is an
// exception the caller sees, and nothing has to be launched besides `specula`. The scheduler,
// tokenizer and sampler stay on the calling thread. Each step: every rank runs its layers; rank r
// returns the logits of its vocabulary part (the host places them side by side) or, for greedy
// rows, its best id and logit (the host keeps the larger, the lower id on ties): a few bytes per
// row instead of a gather of the logits.
#pragma once

#include <memory>

#include "specula/model/model.h"

namespace specula {

// Throws specula::Error when the model cannot be split options.tp_size ways, fewer GPUs are
// present, or a rank fails to load ("rank 1: ..."); every rank is shut down then.
std::unique_ptr<Model> make_tensor_parallel_model(const ModelConfig& config, const WeightSource& weights,
                                                  const ModelOptions& options);

}  // namespace specula
