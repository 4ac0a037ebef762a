// set_kv_buffer kernel: blocks of (token, 256-element chunk of the K and V rows), one element
// per thread, so a decode step's single token is spread over several blocks.
#include <algorithm>

#include "specula/core/convert.cuh"
#include "specula/core/dtype_codes.h"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/kv/cuda/set_kv_buffer.h"

namespace specula::cuda_kernels {

namespace {

template <typename Src, typename Dst>
__global__ void set_kv_kernel(SetKVParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t token = blockIdx.x;
  const int64_t slot = p.loc[token];
  const bool quantise = p.cache_dtype == kFp8E4m3;
  const float k_div = quantise ? p.k_scale : 1.0f;
  const float v_div = quantise ? p.v_scale : 1.0f;
  const Src* k = static_cast<const Src*>(p.k) + token * p.k_stride;
  const Src* v = static_cast<const Src*>(p.v) + token * p.v_stride;
  Dst* kc = static_cast<Dst*>(p.k_cache) + slot * p.row_k;
  Dst* vc = static_cast<Dst*>(p.v_cache) + slot * p.row_v;
  const int i = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (i < p.row_k) kc[i] = from_float<Dst>(to_float(k[i]) / k_div);
  if (i < p.row_v) vc[i] = from_float<Dst>(to_float(v[i]) / v_div);
}

template <typename Src>
void launch_for_src(const SetKVParams& p, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  const unsigned chunks = static_cast<unsigned>((std::max(p.row_k, p.row_v) + kThreads - 1) / kThreads);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), chunks);
  switch (p.cache_dtype) {
    case kF32: launch_pdl(set_kv_kernel<Src, float>, grid, kThreads, 0, stream, p); break;
    case kF16: launch_pdl(set_kv_kernel<Src, __half>, grid, kThreads, 0, stream, p); break;
    case kBF16: launch_pdl(set_kv_kernel<Src, __nv_bfloat16>, grid, kThreads, 0, stream, p); break;
    case kFp8E4m3: launch_pdl(set_kv_kernel<Src, __nv_fp8_e4m3>, grid, kThreads, 0, stream, p); break;
    default: SPECULA_REQUIRE(false, "set_kv_buffer: cache dtype code " + std::to_string(p.cache_dtype) + " is not supported");
  }
}

}  // namespace

void launch_set_kv_buffer(const SetKVParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return;
  switch (p.src_dtype) {
    case kF32: launch_for_src<float>(p, stream); break;
    case kF16: launch_for_src<__half>(p, stream); break;
    case kBF16: launch_for_src<__nv_bfloat16>(p, stream); break;
    default: SPECULA_REQUIRE(false, "set_kv_buffer: source dtype code " + std::to_string(p.src_dtype) + " is not supported");
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
