// CudaLinear: cuBLAS set-up and the choice of product kernel.
#include "specula/model/cuda/cuda_linear.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/model/cuda/fused_ops.h"
#include "specula/model/cuda/gemv.h"
#include "specula/model/cuda/model_ops.h"

namespace specula {

namespace ck = cuda_kernels;

Buffer upload_f32(const std::vector<float>& v, Device device) {
  if (v.empty()) return {};
  Buffer b(DType::f32, {static_cast<int64_t>(v.size())}, device);
  copy(b, TensorView(const_cast<float*>(v.data()), DType::f32, {static_cast<int64_t>(v.size())}));
  return b;
}

Buffer upload_weight(const std::vector<float>& v, Device device) {
  const bool exact = std::all_of(v.begin(), v.end(), [](float x) { return (std::bit_cast<uint32_t>(x) & 0xFFFFu) == 0; });
  if (!exact) return upload_f32(v, device);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(v[i]) >> 16);
  Buffer b(DType::bf16, {static_cast<int64_t>(v.size())}, device);
  copy(b, TensorView(bits.data(), DType::bf16, {static_cast<int64_t>(v.size())}));
  return b;
}

Buffer upload_bf16(const std::vector<float>& v, Device device) {
  if (v.empty()) return {};
  const auto n = static_cast<int64_t>(v.size());
  Buffer host(DType::bf16, {n});
  convert_from_float(v.data(), host.data(), DType::bf16, v.size());
  Buffer b(DType::bf16, {n}, device);
  copy(b, host);
  return b;
}

std::vector<float> stack_rows(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> all;
  for (const auto* p : parts) all.insert(all.end(), p->begin(), p->end());
  return all;
}

Buffer upload_weight_rows(const WeightSource& source, const std::vector<std::pair<std::string, Shape>>& parts,
                          Device device) {
  int64_t total = 0;
  for (const auto& [name, shape] : parts) total += shape.numel();
  Buffer out(DType::bf16, {total}, device);
  auto* dst = static_cast<uint16_t*>(out.data());
  std::vector<float> f32;
  std::vector<uint16_t> bits;
  for (const auto& [name, shape] : parts) {
    const TensorView t = source.get(name, shape);
    if (t.dtype() == DType::bf16) {
      copy(TensorView(dst, DType::bf16, {t.numel()}, device), t.reshape({t.numel()}));
    } else {
      f32.resize(static_cast<size_t>(t.numel()));
      convert_to_float(t.data(), t.dtype(), f32.data(), f32.size());
      bits.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) {
        const auto u = std::bit_cast<uint32_t>(f32[i]);
        if ((u & 0xFFFFu) != 0) {
          // Not a bf16 checkpoint: all parts in f32, as upload_weight keeps them.
          std::vector<float> all;
          for (const auto& [n2, s2] : parts) {
            const TensorView v = source.get(n2, s2);
            const size_t at = all.size();
            all.resize(at + static_cast<size_t>(v.numel()));
            convert_to_float(v.data(), v.dtype(), all.data() + at, static_cast<size_t>(v.numel()));
          }
          return upload_f32(all, device);
        }
        bits[i] = static_cast<uint16_t>(u >> 16);
      }
      copy(TensorView(dst, DType::bf16, {t.numel()}, device), TensorView(bits.data(), DType::bf16, {t.numel()}));
    }
    dst += t.numel();
  }
  return out;
}

CudaLinear::CudaLinear(Device device, void* stream, bool deterministic) : stream_(stream), deterministic_(deterministic) {
  CUDA_CHECK(cudaSetDevice(device.index));
  cublasHandle_t handle = nullptr;
  SPECULA_CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed on {}", device.str());
  // The default math mode: sgemm stays plain f32 (TF32 needs an explicit opt-in) and bf16 GEMMs
  // use the tensor cores.
  cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
  cublasSetStream(handle, static_cast<cudaStream_t>(stream));
  handle_ = handle;
  workspace_ = Buffer(DType::u8, {32 << 20}, device);
  cublasSetWorkspace(handle, workspace_.data(), static_cast<size_t>(workspace_.numel()));
}

CudaLinear::~CudaLinear() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

CudaLinear::Path CudaLinear::path(const Buffer& w, int64_t n, int in) const {
  if (w.dtype() != DType::bf16) return Path::gemm;
  if (forced_ != Path::automatic) return forced_ == Path::gemv && in % 8 != 0 ? Path::gemm : forced_;
  return (n <= kGemvFastRows || deterministic_) && in % 8 == 0 ? Path::gemv : Path::gemm;
}

bool CudaLinear::needs_split(const Buffer& w, int64_t n, int in) const {
  return w.dtype() == DType::bf16 && path(w, n, in) == Path::gemm;
}

void CudaLinear::operator()(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out,
                            void* hi, void* lo, float* halves) const {
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto handle = static_cast<cublasHandle_t>(handle_);
  // Row-major y = x w^T is column-major y^T = w x^T, with w read transposed.
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  if (w.dtype() == DType::f32) {
    status = cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(n), in, &one, w.data_as<const float>(), in,
                         x, in, &zero, y, out);
  } else if (!needs_split(w, n, in)) {
    for (int64_t r = 0; r < n; r += ck::kGemvMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(ck::kGemvMaxRows, n - r));
      ck::gemv_bf16(w.data(), x + r * in, y + r * out, rows, in, out, s);
    }
  } else if (halves != nullptr) {
    // Tensor cores with x split into two bf16 terms stacked as 2n rows: one GEMM reads the weights
    // once; y = (w hi) + (w lo) (+ bias) in one more pass.
    SPECULA_ASSERT(static_cast<uint16_t*>(lo) == static_cast<uint16_t*>(hi) + n * in, "the stacked split needs lo right after hi");
    ck::split_bf16(x, hi, lo, n * in, s);
    status = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(2 * n), in, &one, w.data(), CUDA_R_16BF,
                          in, hi, CUDA_R_16BF, in, &zero, halves, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM ({} x {} x {}) failed with status {}", 2 * n, in, out,
                  static_cast<int>(status));
    ck::add_row_halves(halves, bias.data() != nullptr ? bias.data_as<const float>() : nullptr, y, n, out, s);
    return;
  } else {
    // Tensor cores with x split into two bf16 terms: y = w hi + w lo, accumulated in f32.
    ck::split_bf16(x, hi, lo, n * in, s);
    status = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(n), in, &one, w.data(), CUDA_R_16BF, in,
                          hi, CUDA_R_16BF, in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(n), in, &one, w.data(), CUDA_R_16BF,
                            in, lo, CUDA_R_16BF, in, &one, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
  }
  SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM ({} x {} x {}) failed with status {}", n, in, out,
                static_cast<int>(status));
  if (bias.data() != nullptr) ck::add_bias_rows(y, bias.data_as<const float>(), n, out, s);
}

void CudaLinear::product_bf16_x(const void* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in,
                                int out, float* x_f32) const {
  const auto s = static_cast<cudaStream_t>(stream_);
  if (w.dtype() == DType::f32) {
    ck::bf16_to_f32(x, x_f32, n * in, s);
    (*this)(x_f32, w, bias, y, n, in, out, nullptr, nullptr);
    return;
  }
  if (!needs_split(w, n, in)) {
    for (int64_t r = 0; r < n; r += ck::kGemvMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(ck::kGemvMaxRows, n - r));
      ck::gemv_bf16_xbf16(w.data(), static_cast<const uint16_t*>(x) + r * in, y + r * out, rows, in, out, s);
    }
  } else {
    // x is exactly bf16: one tensor-core GEMM, no hi/lo split.
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t status =
        cublasGemmEx(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(n), in, &one,
                     w.data(), CUDA_R_16BF, in, x, CUDA_R_16BF, in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM ({} x {} x {}) failed with status {}", n, in, out,
                  static_cast<int>(status));
  }
  if (bias.data() != nullptr) ck::add_bias_rows(y, bias.data_as<const float>(), n, out, s);
}

void CudaLinear::gated(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int inter,
                       bool gelu, float* gate_up, void* hi, void* lo, float* halves) const {
  const auto s = static_cast<cudaStream_t>(stream_);
  if (w.dtype() == DType::bf16 && bias.data() == nullptr && !needs_split(w, n, in)) {
    for (int64_t r = 0; r < n; r += ck::kGemvMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(ck::kGemvMaxRows, n - r));
      ck::gemv_bf16_gated(w.data(), x + r * in, y + r * inter, rows, in, inter, gelu, s);
    }
    return;
  }
  (*this)(x, w, bias, gate_up, n, in, 2 * inter, hi, lo, halves);
  ck::gated_activation_fused(gate_up, y, n, inter, gelu, s);
}

void CudaLinear::batched(Strided x, Strided w, bool w_transposed, float* y, int64_t ldy, int64_t stride_y, int64_t n,
                         int in, int out, int batch) const {
  // Row-major y_b = x_b op(w_b) is column-major y_b^T = op(w_b)^T x_b^T: a row-major [in, out] w_b
  // reads as the column-major [out, in] matrix wanted; a row-major [out, in] one needs a transpose.
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t status = cublasSgemmStridedBatched(
      static_cast<cublasHandle_t>(handle_), w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, out,
      static_cast<int>(n), in, &one, w.data, static_cast<int>(w.ld), w.stride, x.data, static_cast<int>(x.ld), x.stride,
      &zero, y, static_cast<int>(ldy), stride_y, batch);
  SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS batched GEMM ({} x [{} x {} x {}]) failed with status {}", batch,
                n, in, out, static_cast<int>(status));
}

void CudaLinear::batched_bf16(StridedBf16 x, StridedBf16 w, void* y, int64_t ldy, int64_t stride_y, int64_t n, int in,
                              int out, int batch) const {
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t status = cublasGemmStridedBatchedEx(
      static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(n), in, &one, w.data,
      CUDA_R_16BF, static_cast<int>(w.ld), w.stride, x.data, CUDA_R_16BF, static_cast<int>(x.ld), x.stride, &zero, y,
      CUDA_R_16BF, static_cast<int>(ldy), stride_y, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS bf16 batched GEMM ({} x [{} x {} x {}]) failed with status {}",
                batch, n, in, out, static_cast<int>(status));
}

}  // namespace specula
