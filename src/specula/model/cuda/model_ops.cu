// The decoder's element-wise GPU kernels: one thread per element, or one block per row where a
// row reduction is needed (RMSNorm).
#include <cuda_bf16.h>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/model/cuda/model_ops.h"
#include "specula/model/cuda/reduce.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t count) { return static_cast<unsigned>((count + kThreads - 1) / kThreads); }

__global__ void embed_kernel(const float* table, const int32_t* ids, float* out, int64_t n, int hidden, float scale) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * hidden) return;
  const int64_t t = i / hidden;
  out[i] = table[static_cast<int64_t>(ids[t]) * hidden + i % hidden] * scale;
}

__global__ void embed_bf16_kernel(const __nv_bfloat16* table, const int32_t* ids, float* out, int64_t n, int hidden,
                                  float scale) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * hidden) return;
  const int64_t t = i / hidden;
  out[i] = __bfloat162float(table[static_cast<int64_t>(ids[t]) * hidden + i % hidden]) * scale;
}

__global__ void split_bf16_kernel(const float* x, __nv_bfloat16* hi, __nv_bfloat16* lo, int64_t count) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
  hi[i] = h;
  lo[i] = __float2bfloat16_rn(x[i] - __bfloat162float(h));
}

__global__ void add_row_halves_kernel(const float* halves, const float* b, float* y, int64_t count, int width) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float sum = halves[i] + halves[count + i];
  y[i] = b != nullptr ? sum + b[i % width] : sum;
}

__global__ void rms_norm_kernel(const float* x, const float* w, float* y, int width, float eps) {
  pdl_wait();
  pdl_trigger();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * width;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * width;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(sum) / static_cast<float>(width) + eps);
  for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t count, int width) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] += b[i % width];
}

__global__ void add_kernel(float* x, const float* y, int64_t count) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] += y[i];
}

__global__ void from_bf16_kernel(const __nv_bfloat16* x, float* y, int64_t count) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] = __bfloat162float(x[i]);
}

__global__ void softcap_kernel(float* x, int64_t count, float cap) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void gather_kernel(const float* x, const int32_t* rows, float* out, int64_t count, int width) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count * width) out[i] = x[static_cast<int64_t>(rows[i / width]) * width + i % width];
}

}  // namespace

void embed_rows_bf16(const void* table, const int32_t* ids, float* out, int64_t n, int hidden, float scale, cudaStream_t s) {
  launch_pdl(embed_bf16_kernel, blocks_for(n * hidden), kThreads, 0, s, static_cast<const __nv_bfloat16*>(table), ids,
             out, n, hidden, scale);
  CUDA_CHECK(cudaGetLastError());
}

void split_bf16(const float* x, void* hi, void* lo, int64_t count, cudaStream_t s) {
  launch_pdl(split_bf16_kernel, blocks_for(count), kThreads, 0, s, x, static_cast<__nv_bfloat16*>(hi),
             static_cast<__nv_bfloat16*>(lo), count);
  CUDA_CHECK(cudaGetLastError());
}

void embed_rows(const float* table, const int32_t* ids, float* out, int64_t n, int hidden, float scale, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(embed_kernel, blocks_for(n * hidden), kThreads, 0, s, table, ids, out, n, hidden, scale);
  CUDA_CHECK(cudaGetLastError());
}

void rms_norm_rows(const float* x, const float* w, float* y, int64_t rows, int width, float eps, cudaStream_t s) {
  if (rows == 0) return;
  launch_pdl(rms_norm_kernel, static_cast<unsigned>(rows), row_threads(width), 0, s, x, w, y, width, eps);
  CUDA_CHECK(cudaGetLastError());
}

void add_bias_rows(float* y, const float* b, int64_t rows, int width, cudaStream_t s) {
  if (rows == 0) return;
  launch_pdl(add_bias_kernel, blocks_for(rows * width), kThreads, 0, s, y, b, rows * width, width);
  CUDA_CHECK(cudaGetLastError());
}

void add_row_halves(const float* halves, const float* b, float* y, int64_t rows, int width, cudaStream_t s) {
  if (rows == 0) return;
  const int64_t count = rows * width;
  launch_pdl(add_row_halves_kernel, blocks_for(count), kThreads, 0, s, halves, b, y, count, width);
  CUDA_CHECK(cudaGetLastError());
}

void add_inplace(float* x, const float* y, int64_t count, cudaStream_t s) {
  if (count == 0) return;
  launch_pdl(add_kernel, blocks_for(count), kThreads, 0, s, x, y, count);
  CUDA_CHECK(cudaGetLastError());
}

void bf16_to_f32(const void* x, float* y, int64_t count, cudaStream_t s) {
  if (count == 0) return;
  launch_pdl(from_bf16_kernel, blocks_for(count), kThreads, 0, s, static_cast<const __nv_bfloat16*>(x), y, count);
  CUDA_CHECK(cudaGetLastError());
}

void softcap(float* x, int64_t count, float cap, cudaStream_t s) {
  if (count == 0) return;
  launch_pdl(softcap_kernel, blocks_for(count), kThreads, 0, s, x, count, cap);
  CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const float* x, const int32_t* rows, float* out, int64_t count, int width, cudaStream_t s) {
  if (count == 0) return;
  launch_pdl(gather_kernel, blocks_for(count * width), kThreads, 0, s, x, rows, out, count, width);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
