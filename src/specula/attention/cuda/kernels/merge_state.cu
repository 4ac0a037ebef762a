// merge_state kernel: one warp per row; each lane handles head_dim / 32 elements.
//   m = max(s_a, s_b); w_x = exp(s_x - m) (0 for an empty part, whose value is ignored even if
//   NaN); v = (w_a v_a + w_b v_b) / (w_a + w_b); s = m + log(w_a + w_b); both empty: v = 0,
//   s = -inf.
#include "specula/core/convert.cuh"
#include "specula/core/dtype_codes.h"
#include "specula/attention/cuda/kernels/merge_state.h"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();

template <typename T>
__global__ void merge_state_kernel(const MergeStateParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= p.num_rows) return;
  const int lane = threadIdx.x & 31;
  const float sa = p.s_a[row];
  const float sb = p.s_b[row];
  const float m = fmaxf(sa, sb);
  const float wa = (m == kNegInf || sa == kNegInf) ? 0.0f : expf(sa - m);
  const float wb = (m == kNegInf || sb == kNegInf) ? 0.0f : expf(sb - m);
  const float denom = wa + wb;
  const T* va = static_cast<const T*>(p.v_a) + row * p.head_dim;
  const T* vb = static_cast<const T*>(p.v_b) + row * p.head_dim;
  T* vo = static_cast<T*>(p.v_out) + row * p.head_dim;
  for (int d = lane; d < p.head_dim; d += 32) {
    const float a = wa > 0.0f ? wa * to_float(va[d]) : 0.0f;
    const float b = wb > 0.0f ? wb * to_float(vb[d]) : 0.0f;
    vo[d] = from_float<T>(denom > 0.0f ? (a + b) / denom : 0.0f);
  }
  __syncwarp();
  if (lane == 0) p.s_out[row] = denom > 0.0f ? m + logf(denom) : kNegInf;
}

}  // namespace

void launch_merge_state(const MergeStateParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return;
  constexpr int kWarps = 4;
  const dim3 grid(static_cast<unsigned>((p.num_rows + kWarps - 1) / kWarps));
  switch (p.dtype) {
    case kF32: launch_pdl(merge_state_kernel<float>, grid, kWarps * 32, 0, stream, p); break;
    case kF16: launch_pdl(merge_state_kernel<__half>, grid, kWarps * 32, 0, stream, p); break;
    case kBF16: launch_pdl(merge_state_kernel<__nv_bfloat16>, grid, kWarps * 32, 0, stream, p); break;
    default: SPECULA_REQUIRE(false, "merge_state: dtype code " + std::to_string(p.dtype) + " is not supported");
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
