// tp_greedy_combine's kernels: fill each rank's slots, pick each row's best.
#include <cmath>

#include "specula/core/cuda_check.h"
#include "specula/parallel/tp_greedy_kernels.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 256;

// slots [size][rows][2]: zeros, and this rank's (value, id) pairs.
__global__ void fill_slots(const int32_t* ids, const float* values, int64_t rows, int rank, int size,
                           int64_t vocab_begin, float* slots) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * size) return;
  const int r = static_cast<int>(i / rows);
  const int64_t row = i % rows;
  float v = 0.0f, id = 0.0f;
  if (r == rank) {
    const bool any = ids[row] >= 0;
    v = any ? values[row] : -INFINITY;
    id = any ? static_cast<float>(ids[row] + vocab_begin) : -1.0f;
  }
  slots[2 * i] = v;
  slots[2 * i + 1] = id;
}

__global__ void pick(const float* slots, int64_t rows, int size, int32_t* ids, float* values) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (row >= rows) return;
  float best = -INFINITY;
  int32_t id = -1;
  // Ranks in order hold ascending ids: a strict > keeps the lower id on ties.
  for (int r = 0; r < size; ++r) {
    const float v = slots[2 * (r * rows + row)];
    const auto candidate = static_cast<int32_t>(slots[2 * (r * rows + row) + 1]);
    if (candidate >= 0 && v > best) {
      best = v;
      id = candidate;
    }
  }
  ids[row] = id;
  values[row] = best;
}

}  // namespace

void tp_greedy_fill(const int32_t* ids, const float* values, int64_t rows, int rank, int size, int64_t vocab_begin,
                    float* slots, cudaStream_t s) {
  const auto blocks = static_cast<unsigned>((rows * size + kThreads - 1) / kThreads);
  fill_slots<<<blocks, kThreads, 0, s>>>(ids, values, rows, rank, size, vocab_begin, slots);
  CUDA_CHECK(cudaGetLastError());
}

void tp_greedy_pick(const float* slots, int64_t rows, int size, int32_t* ids, float* values, cudaStream_t s) {
  pick<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0, s>>>(slots, rows, size, ids, values);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
