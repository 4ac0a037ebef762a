// DecodeGraphs: capture and lookup.
#include "specula/model/cuda/decode_graphs.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"

namespace specula {

void DecodeGraphs::capture(std::vector<int> batch_sizes, int32_t padding_req_row, int32_t padding_slot, void* stream,
                           const std::function<void(ForwardBatch&)>& prepare,
                           const std::function<void(const ForwardBatch&)>& step, const std::function<void()>& freeze) {
  padding_req_row_ = padding_req_row;
  padding_slot_ = padding_slot;
  std::sort(batch_sizes.begin(), batch_sizes.end(), std::greater<>());
  for (int bs : batch_sizes) {
    SPECULA_CHECK(bs >= 1, "CUDA-graph batch size {} is not valid", bs);
    ForwardBatch b = padding_decode_batch(bs, padding_req_row_, padding_slot_);
    prepare(b);
    step(b);
    CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    freeze();
    graphs_[bs] = std::make_unique<CudaGraph>(stream, [&] { step(b); });
  }
}

const CudaGraph* DecodeGraphs::find(const ForwardBatch& batch, ForwardBatch* padded) const {
  if (batch.forward_mode != ForwardMode::DECODE) return nullptr;
  const auto it = graphs_.lower_bound(batch.batch_size);
  if (it == graphs_.end()) return nullptr;
  *padded = pad_decode_batch(batch, it->first, padding_req_row_, padding_slot_);
  return it->second.get();
}

std::vector<int> DecodeGraphs::batch_sizes() const {
  std::vector<int> sizes;
  for (const auto& [bs, graph] : graphs_) sizes.push_back(bs);
  return sizes;
}

}  // namespace specula
