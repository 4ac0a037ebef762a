// Weights on the device and the products of the GPU decoders (LlamaCudaModel, the EAGLE head):
// y[n, out] = x[n, in] w[out, in]^T (+ bias) with f32 activations. bf16 weights: the GEMV kernel
// for up to kGemvFastRows rows (any rows in deterministic mode), else bf16 tensor-core GEMMs over
// a hi/lo split of x: one GEMM over the stacked [hi; lo] rows where the caller gives scratch for
// its 2n output rows (the weights are read once: what memory-bound steps of a few rows need),
// else two; f32 weights: cuBLAS sgemm.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "specula/core/tensor.h"
#include "specula/model/weights.h"

#include <string>
#include <utility>

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
// The same straight from a checkpoint, held as upload_weight holds them: bf16 tensors are copied to
// the device as they are, one at a time (no f32 copy of the model on the host); f32 or f16 ones
// are converted, and kept in f32 unless every value is exactly a bf16.
Buffer upload_weight_rows(const WeightSource& source, const std::vector<std::pair<std::string, Shape>>& parts,
                          Device device);

class CudaLinear {
 public:
  // Runs on stream (a cudaStream_t) with its own cuBLAS handle and fixed workspace (graph capture
  // never sees cuBLAS allocate).
  CudaLinear(Device device, void* stream, bool deterministic);
  ~CudaLinear();
  CudaLinear(const CudaLinear&) = delete;
  CudaLinear& operator=(const CudaLinear&) = delete;

  // Rows the GEMV serves outside deterministic mode: it reads the weights once for all its rows,
  // but past two rows it falls behind a tensor-core GEMM over the stacked split (H200, Llama-3-8B
  // shapes: 8 rows took 1.8x a 1-row step, the stacked GEMM about what one row takes).
  static constexpr int kGemvFastRows = 2;
  // Which kernel a bf16 product takes; automatic is the rule above. Benchmarks force the others
  // (the GEMV takes any row count, in chunks of its largest); a forced path overrides
  // deterministic mode's GEMV-only rule, so deterministic runs leave it automatic.
  enum class Path { automatic, gemv, gemm };
  void force_path(Path path) { forced_ = path; }
  // The kernel a product of n rows of `in` inputs takes (gemm for f32 weights).
  Path path(const Buffer& w, int64_t n, int in) const;
  // The stacked split's output scratch is kept under this (larger products take two GEMMs).
  static constexpr int64_t kMaxStackedBytes = 64ll << 20;
  // Whether a product needs the bf16 hi/lo scratch (n * in values each), and whether it may take
  // the stacked form (2 n * out f32 values of scratch).
  bool needs_split(const Buffer& w, int64_t n, int in) const;
  static bool stacks(int64_t n, int out) { return 2 * n * out * static_cast<int64_t>(sizeof(float)) <= kMaxStackedBytes; }
  // hi, lo: bf16 scratch of n * in values when needs_split, else unused. halves: null, or (with
  // lo == hi + n * in) f32 scratch of 2 n * out values for the stacked form.
  void operator()(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out, void* hi,
                  void* lo, float* halves = nullptr) const;
  // y[n, out] = x w^T (+ bias) with bf16 activations x [n, in] (attention's output). The GEMV and
  // the tensor-core GEMM read x as it is; f32 weights need it as f32 in x_f32 (n * in values).
  void product_bf16_x(const void* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out,
                      float* x_f32) const;
  // The gated MLP's first half: y[n, inter] = act(x w_gate^T) * (x w_up^T) for w = [gate; up]
  // ([2 inter, in]), act silu or gelu_tanh. One GEMV launch when the GEMV serves n rows and there
  // is no bias; otherwise the product into gate_up (n * 2 inter f32 values) and the activation
  // kernel. hi, lo as for operator().
  void gated(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int inter, bool gelu,
             float* gate_up, void* hi, void* lo, float* halves = nullptr) const;
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
  Path forced_ = Path::automatic;
  Buffer workspace_;
};

}  // namespace specula
