// GPU ceilings: a 2 GiB device-to-device copy, an 8192^3 bf16 cuBLAS GEMM, and a streaming read
// of a given size.
#include "specula/cli/cuda_ceilings.h"

#include <algorithm>
#include <cstdint>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <random>
#include <string>
#include <vector>

#include "specula/cli/cuda_timing.h"
#include "specula/core/error.h"
#include "specula/core/tensor.h"

namespace specula {

void fill_random_bf16(const Buffer& b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t block = std::min<int64_t>(b.numel(), int64_t{4} << 20);
  std::vector<float> tmp(static_cast<size_t>(block));
  for (float& x : tmp) x = dist(rng);
  Buffer host(DType::bf16, {block});
  convert_from_float(tmp.data(), host.data(), DType::bf16, tmp.size());
  for (int64_t done = 0; done < b.numel(); done += block) {
    const int64_t count = std::min(block, b.numel() - done);
    copy(TensorView(b.data_as<uint16_t>() + done, DType::bf16, {count}, b.device()), host.view().slice(0, count));
  }
}

CudaCeilings measure_cuda_ceilings(Device device) {
  CUDA_CHECK(cudaSetDevice(device.index));
  CudaCeilings c;
  static cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
  c.device_name = prop.name;

  const int64_t elems = int64_t{1} << 30;  // 2 GiB of bf16 each way
  Buffer src(DType::bf16, {elems}, device), dst(DType::bf16, {elems}, device);
  fill_random_bf16(src, 1);
  const double copy_s = cuda_median_seconds(
      [&] { CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice)); }, 10);
  c.copy_tbps = 2.0 * static_cast<double>(src.nbytes()) / copy_s / 1e12;

  const int n = 8192;
  Buffer a(DType::bf16, {n, n}, device), b(DType::bf16, {n, n}, device), out(DType::f32, {n, n}, device);
  fill_random_bf16(a, 2);
  fill_random_bf16(b, 3);
  cublasHandle_t handle;
  SPECULA_CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    const cublasStatus_t status =
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(), CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n,
                     &beta, out.data(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cublasGemmEx failed with status {}", static_cast<int>(status));
  };
  const double gemm_s = cuda_median_seconds(gemm, 10, 3);
  c.gemm_tflops = 2.0 * n * n * static_cast<double>(n) / gemm_s / 1e12;
  cublasDestroy(handle);
  return c;
}

double measure_cuda_read_tbps(Device device, size_t bytes, const std::string& l2) {
  CUDA_CHECK(cudaSetDevice(device.index));
  const size_t n = bytes / 16 * 16;  // the kernel reads 16-byte chunks
  SPECULA_CHECK(n > 0, "a read ceiling of {} bytes: at least 16 are needed", bytes);
  Buffer data(DType::u8, {static_cast<int64_t>(n + 16)}, device);
  CUDA_CHECK(cudaMemset(data.data(), 0x3c, n + 16));
  auto* sink = reinterpret_cast<unsigned*>(static_cast<uint8_t*>(data.data()) + n);
  const double s = cuda_median_seconds([&] { cuda_kernels::read_through_l2(data.data(), n, sink, nullptr); }, 30, 3,
                                       parse_l2_start(l2));
  return static_cast<double>(n) / s / 1e12;
}

}  // namespace specula
