// merge_state on the CPU.
#include "specula/attention/merge_state.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#ifdef SPECULA_HAS_CUDA
#include "specula/core/dtype_code.h"
#include "specula/attention/cuda/kernels/merge_state.h"
#endif

namespace specula {

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, void* cuda_stream) {
  SPECULA_CHECK(v_a.rank() == 3, "merge_state: v_a {} must be [num_tokens, num_heads, head_dim]", v_a.str());
  const int64_t n = v_a.size(0), h = v_a.size(1), d = v_a.size(2);
  check_shape(v_b, v_a.shape(), "merge_state v_b");
  check_shape(v_out, v_a.shape(), "merge_state v_out");
  for (const TensorView* s : {&s_a, &s_b, &s_out}) {
    check_shape(*s, {n, h}, "merge_state lse");
    check_dtype(*s, DType::f32, "merge_state lse");
    SPECULA_CHECK(s->is_contiguous(), "merge_state lse {} must be contiguous", s->str());
  }
  const Device device = v_a.device();
  for (const TensorView* t : {&v_b, &v_out, &s_a, &s_b, &s_out}) check_device(*t, device, "merge_state input");
  for (const TensorView* v : {&v_a, &v_b, &v_out}) {
    SPECULA_CHECK(v->is_contiguous() && v->dtype() == v_a.dtype(), "merge_state: {} must be contiguous and of one dtype",
                  v->str());
    SPECULA_CHECK(v->dtype() == DType::f32 || v->dtype() == DType::bf16 || v->dtype() == DType::f16,
                  "merge_state value dtype {} is not supported; supported: f32, bf16, f16", dtype_name(v->dtype()));
  }
  if (device.is_cuda()) {
#ifdef SPECULA_HAS_CUDA
    cuda_kernels::MergeStateParams p{};
    p.v_a = v_a.data();
    p.s_a = s_a.data_as<const float>();
    p.v_b = v_b.data();
    p.s_b = s_b.data_as<const float>();
    p.v_out = v_out.data();
    p.s_out = s_out.data_as<float>();
    p.dtype = kernel_dtype_code(v_a.dtype());
    p.num_rows = n * h;
    p.head_dim = static_cast<int32_t>(d);
    cuda_kernels::launch_merge_state(p, static_cast<cudaStream_t>(cuda_stream));
    return;
#endif
  }
  (void)cuda_stream;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> a(static_cast<size_t>(d)), b(static_cast<size_t>(d));
  for (int64_t row = 0; row < n * h; ++row) {
    const float sa = s_a.data_as<const float>()[row];
    const float sb = s_b.data_as<const float>()[row];
    const float m = std::max(sa, sb);
    const size_t off = static_cast<size_t>(row * d);
    if (m == kNegInf) {
      for (int64_t i = 0; i < d; ++i) store_from_float(v_out.data(), v_out.dtype(), off + static_cast<size_t>(i), 0.0f);
      s_out.data_as<float>()[row] = kNegInf;
      continue;
    }
    const float wa = sa == kNegInf ? 0.0f : std::exp(sa - m);
    const float wb = sb == kNegInf ? 0.0f : std::exp(sb - m);
    const float inv = 1.0f / (wa + wb);
    convert_to_float(static_cast<const char*>(v_a.data()) + off * dtype_size(v_a.dtype()), v_a.dtype(), a.data(),
                     static_cast<size_t>(d));
    convert_to_float(static_cast<const char*>(v_b.data()) + off * dtype_size(v_b.dtype()), v_b.dtype(), b.data(),
                     static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) {
      const auto ui = static_cast<size_t>(i);
      // A zero weight must not let a NaN/inf in the ignored part through (0 * inf = NaN).
      const float va = wa > 0.0f ? wa * a[ui] : 0.0f;
      const float vb = wb > 0.0f ? wb * b[ui] : 0.0f;
      store_from_float(v_out.data(), v_out.dtype(), off + ui, (va + vb) * inv);
    }
    s_out.data_as<float>()[row] = m + std::log(wa + wb);
  }
}

}  // namespace specula
