// DecodeGraphs: capture and lookup.
#include "specula/model/cuda/decode_graphs.h"

#include <cuda_runtime_api.h>


#include "specula/core/cuda_check.h"
#include "specula/core/error.h"

namespace specula {

void DecodeGraphs::capture(std::vector<int> batch_sizes, int32_t padding_req_row, int32_t padding_slot, void* stream,
                           const std::function<void(ForwardBatch&)>& prepare,
                           const std::function<void(const ForwardBatch&)>& step, const std::function<void()>& freeze) {
  padding_req_row_ = padding_req_row;
  padding_slot_ = padding_slot;
  ForwardBatch b;
  graphs_.capture(
      stream, std::move(batch_sizes),
      [&](int bs) {
        b = padding_decode_batch(bs, padding_req_row_, padding_slot_);
        prepare(b);
      },
      [&](int) { step(b); }, freeze);
}

const CudaGraph* DecodeGraphs::find(const ForwardBatch& batch, ForwardBatch* padded) const {
  if (batch.forward_mode != ForwardMode::DECODE) return nullptr;
  const auto [bs, graph] = graphs_.find(batch.batch_size);
  if (graph == nullptr) return nullptr;
  *padded = pad_decode_batch(batch, bs, padding_req_row_, padding_slot_);
  return graph;
}

std::vector<int> DecodeGraphs::batch_sizes() const { return graphs_.batch_sizes(); }

}  // namespace specula
