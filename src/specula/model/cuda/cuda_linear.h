// Weights on the device and the products of the GPU decoders (LlamaCudaModel, the EAGLE head):
// y[n, out] = x[n, in] w[out, in]^T (+ bias) with f32 activations. bf16 weights: the GEMV kernel
// for up to kGemvMaxRows rows (or any rows in deterministic mode), else two bf16 tensor-core
// GEMMs over a hi/lo split of x; f32 weights: cuBLAS sgemm.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "specula/core/tensor.h"

namespace specula {

// f32 values as an f32 device buffer (empty in, empty out).
Buffer upload_f32(const std::vector<float>& v, Device device);
// A weight matrix as bf16 when every value is exactly a bf16 (a bf16 checkpoint), which halves
// what each step reads and loses nothing; otherwise as f32.
Buffer upload_weight(const std::vector<float>& v, Device device);
// f32 values rounded to bf16 (round to nearest even) as a bf16 device buffer.
Buffer upload_bf16(const std::vector<float>& v, Device device);
// Row-major matrices with the same width stacked into one (one product instead of several).
std::vector<float> stack_rows(std::initializer_list<const std::vector<float>*> parts);

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
  // y[n, out] = x w^T (+ bias) with bf16 activations x [n, in] (attention's output). The GEMV and
  // the tensor-core GEMM read x as it is; f32 weights need it as f32 in x_f32 (n * in values).
  void product_bf16_x(const void* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out,
                      float* x_f32) const;
  // The gated MLP's first half: y[n, inter] = act(x w_gate^T) * (x w_up^T) for w = [gate; up]
  // ([2 inter, in]), act silu or gelu_tanh. One GEMV launch when the GEMV serves n rows and there
  // is no bias; otherwise the product into gate_up (n * 2 inter f32 values) and the activation
  // kernel. hi, lo as for operator().
  void gated(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int inter, bool gelu,
             float* gate_up, void* hi, void* lo) const;
  // Per-head products of f32 operands (MLA's W_UK / W_UV), for b in [0, batch):
  // y_b[n, out] = x_b[n, in] * w_b, w_b [in, out] (w_transposed false) or [out, in]^T (true);
  // operand b starts stride_* floats after operand b - 1 and its rows are ld* floats apart.
  struct Strided {
    const float* data;
    int64_t ld, stride;
  };
  void batched(Strided x, Strided w, bool w_transposed, float* y, int64_t ldy, int64_t stride_y, int64_t n, int in,
               int out, int batch) const;
  // The same on bf16 tensor cores with f32 accumulation, y_b[n, out] = x_b[n, in] w_b[out, in]^T,
  // all bf16 (MLA's expanded keys and values: x the latent rows with stride 0, y strided into K/V).
  struct StridedBf16 {
    const void* data;
    int64_t ld, stride;
  };
  void batched_bf16(StridedBf16 x, StridedBf16 w, void* y, int64_t ldy, int64_t stride_y, int64_t n, int in, int out,
                    int batch) const;

 private:
  void* stream_;
  void* handle_ = nullptr;  // cublasHandle_t
  bool deterministic_;
  Buffer workspace_;
};

}  // namespace specula
