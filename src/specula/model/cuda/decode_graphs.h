// DecodeGraphs: one captured DECODE-step graph per batch size (SGLang's CudaGraphRunner), for the
// GPU decoders. Padding rows are one-token requests of token id 0 at position 0 in a request row
// set aside for them, whose token is a KV slot set aside too; a batch replays in the smallest
// graph that holds it, padded up to its size.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "specula/batch/forward_batch.h"
#include "specula/core/cuda_graph.h"

namespace specula {

class DecodeGraphs {
 public:
  // For each size, largest first: prepare(b) points the padding batch b at the pools and readies
  // the backend's capture metadata and the step's inputs; step(b) runs once eagerly (one-time
  // set-ups of cuBLAS and the backend happen outside capture, and the largest sizes the
  // workspace), then freeze() is called and step(b) is recorded.
  void capture(std::vector<int> batch_sizes, int32_t padding_req_row, int32_t padding_slot, void* stream,
               const std::function<void(ForwardBatch&)>& prepare, const std::function<void(const ForwardBatch&)>& step,
               const std::function<void()>& freeze);
  // The graph that serves a DECODE batch, and the batch padded to its size in *padded; nullptr
  // (padded untouched) when the batch is not DECODE or larger than every graph.
  const CudaGraph* find(const ForwardBatch& batch, ForwardBatch* padded) const;
  std::vector<int> batch_sizes() const;
  void clear() { graphs_.clear(); }

 private:
  CudaGraphSet graphs_;
  int32_t padding_req_row_ = -1;
  int32_t padding_slot_ = 0;
};

}  // namespace specula
