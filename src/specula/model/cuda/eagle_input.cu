// One block per token: the embedding row and the hidden row each reduced for their RMSNorm.
#include <cuda_bf16.h>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/model/cuda/reduce.cuh"
#include "specula/model/cuda/eagle_input.h"

namespace specula::cuda_kernels {

namespace {

template <bool BF16>
__global__ void eagle3_input_kernel(const void* embed, const int32_t* ids, const float* x, const float* input_norm,
                                    const float* hidden_norm, float* a, float* x_out, int hidden, float eps) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t id = ids[t];
  const float* xr = x + t * hidden;
  float* ar = a + t * 2 * hidden;
  auto emb = [&](int i) {
    if constexpr (BF16) {
      return __bfloat162float(static_cast<const __nv_bfloat16*>(embed)[id * hidden + i]);
    } else {
      return static_cast<const float*>(embed)[id * hidden + i];
    }
  };
  float se = 0.0f, sx = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float e = emb(i), v = xr[i];
    se += e * e;
    sx += v * v;
  }
  const float inv_e = rsqrtf(block_sum(se) / static_cast<float>(hidden) + eps);
  // block_sum's shared partials are reused by the second reduction.
  __syncthreads();
  const float inv_x = rsqrtf(block_sum(sx) / static_cast<float>(hidden) + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = xr[i];
    ar[i] = input_norm[i] * (emb(i) * inv_e);
    ar[hidden + i] = hidden_norm[i] * (v * inv_x);
    if (x_out != nullptr) x_out[t * hidden + i] = v;
  }
}

}  // namespace

void eagle3_attention_input(const void* embed, bool embed_bf16, const int32_t* ids, const float* x,
                            const float* input_norm, const float* hidden_norm, float* a, float* x_out, int64_t n,
                            int hidden, float eps, cudaStream_t s) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(n);
  const int threads = row_threads(hidden);
  if (embed_bf16) {
    launch_pdl(eagle3_input_kernel<true>, blocks, threads, 0, s, embed, ids, x, input_norm, hidden_norm, a, x_out,
               hidden, eps);
  } else {
    launch_pdl(eagle3_input_kernel<false>, blocks, threads, 0, s, embed, ids, x, input_norm, hidden_norm, a, x_out,
               hidden, eps);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
