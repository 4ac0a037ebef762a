// tp_greedy_combine: fill, all-reduce (an all-gather), pick.
#include "specula/parallel/tp_greedy.h"

#include "specula/core/cuda_check.h"
#include "specula/parallel/tp_comm.h"
#include "specula/parallel/tp_greedy_kernels.h"

namespace specula {

void tp_greedy_combine(TpComm& comm, int32_t* ids, float* values, int64_t rows, int64_t vocab_begin, Buffer& scratch,
                       Device device, cudaStream_t s) {
  if (rows == 0) return;
  const int size = comm.size();
  // A multiple of 4 floats (the peer path's unit), the same on every rank.
  const int64_t count = (2 * rows * size + 3) / 4 * 4;
  if (scratch.data() == nullptr || scratch.numel() < count) scratch = Buffer(DType::f32, {count}, device);
  auto* slots = scratch.data_as<float>();
  CUDA_CHECK(cudaMemsetAsync(slots, 0, static_cast<size_t>(count) * sizeof(float), s));
  cuda_kernels::tp_greedy_fill(ids, values, rows, comm.rank(), size, vocab_begin, slots, s);
  comm.all_reduce(slots, count, s);
  cuda_kernels::tp_greedy_pick(slots, rows, size, ids, values, s);
}

}  // namespace specula
