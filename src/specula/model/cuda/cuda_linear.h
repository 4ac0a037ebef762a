// Weights on the device and the products of the GPU decoders (LlamaCudaModel, the EAGLE head):
// y[n, out] = x[n, in] w[out, in]^T (+ bias) with f32 activations. bf16 weights: the GEMV kernel
// for up to kGemvMaxRows rows (or any rows in deterministic mode), else two bf16 tensor-core
// GEMMs over a hi/lo split of x; f32 weights: cuBLAS sgemm.
#pragma once

#include <cstdint>
#include <vector>

#include "specula/core/tensor.h"

namespace specula {

// f32 values as an f32 device buffer (empty in, empty out).
Buffer upload_f32(const std::vector<float>& v, Device device);
// A weight matrix as bf16 when every value is exactly a bf16 (a bf16 checkpoint), which halves
// what each step reads and loses nothing; otherwise as f32.
Buffer upload_weight(const std::vector<float>& v, Device device);

class CudaLinear {
 public:
  // Runs on stream (a cudaStream_t) with its own cuBLAS handle and fixed workspace (graph capture
  // never sees cuBLAS allocate).
  CudaLinear(Device device, void* stream, bool deterministic);
  ~CudaLinear();
  CudaLinear(const CudaLinear&) = delete;
  CudaLinear& operator=(const CudaLinear&) = delete;

  // Whether a product needs the bf16 hi/lo scratch (n * in values each).
  bool needs_split(const Buffer& w, int64_t n, int in) const;
  // hi, lo: bf16 scratch of n * in values when needs_split, else unused.
  void operator()(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out, void* hi,
                  void* lo) const;

 private:
  void* stream_;
  void* handle_ = nullptr;  // cublasHandle_t
  bool deterministic_;
  Buffer workspace_;
};

}  // namespace specula
