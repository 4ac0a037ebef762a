// GPU decoder plumbing.
#include "specula/model/cuda/step_io.h"

#include "specula/core/cuda_check.h"

namespace specula {

void* create_model_stream(Device device) {
  CUDA_CHECK(cudaSetDevice(device.index));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  return stream;
}

void upload_i32_async(Buffer& dst, const std::vector<int32_t>& src, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
}

std::vector<int32_t> logit_rows(const ForwardBatch& batch, bool all_tokens) {
  std::vector<int32_t> rows;
  if (all_tokens || batch.num_tokens() == batch.batch_size) return rows;
  int32_t end = 0;
  for (int r = 0; r < batch.batch_size; ++r) {
    end += batch.query_len(r);
    rows.push_back(end - 1);
  }
  return rows;
}

}  // namespace specula
