// One warp per (token, head) row: m = the largest part LSE, w_i = exp(lse_i - m) (0 for an empty
// part), out = sum w_i v_i / sum w_i, lse = m + log(sum w_i); every part empty: 0 and -inf.
#include "specula/attention/cuda/kernels/dual_chunk_merge.h"

#include <string>

#include "specula/attention/cuda/kernels/io.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/dtype_codes.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kMaxParts = 3;

__global__ void dual_chunk_merge_kernel(const DualChunkMergeParams p) {
  constexpr float kNegInf = -__builtin_huge_valf();
  pdl_wait();
  pdl_trigger();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t rows = p.num_tokens * p.num_heads;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float s[kMaxParts];
  float m = kNegInf;
  for (int i = 0; i < p.num_parts; ++i) {
    s[i] = p.part_lse[i * rows + row];
    m = fmaxf(m, s[i]);
  }
  float w[kMaxParts];
  float denom = 0.0f;
  for (int i = 0; i < p.num_parts; ++i) {
    w[i] = (m == kNegInf || s[i] == kNegInf) ? 0.0f : expf(s[i] - m);
    denom += w[i];
  }
  const int64_t token = row / p.num_heads;
  const int head = static_cast<int>(row % p.num_heads);
  const int64_t base = token * p.out_stride_token + head * p.out_stride_head;
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.0f;
    for (int i = 0; i < p.num_parts; ++i) {
      if (w[i] > 0.0f) acc += w[i] * p.parts[(i * rows + row) * p.head_dim + d];
    }
    store_io(p.out, p.io_dtype, base + d, denom > 0.0f ? acc / denom : 0.0f);
  }
  if (p.lse != nullptr && lane == 0) p.lse[token * p.lse_stride_token + head] = denom > 0.0f ? m + logf(denom) : kNegInf;
}

}  // namespace

void launch_dual_chunk_merge(const DualChunkMergeParams& p, cudaStream_t stream) {
  SPECULA_REQUIRE(p.num_parts >= 1 && p.num_parts <= kMaxParts,
                  "dual_chunk_merge: " + std::to_string(p.num_parts) + " parts; 1 to 3 are supported");
  SPECULA_REQUIRE(p.io_dtype == kBF16 || p.io_dtype == kF16,
                  "dual_chunk_merge: output dtype code " + std::to_string(p.io_dtype) + " is not supported");
  const int64_t rows = p.num_tokens * p.num_heads;
  if (rows == 0) return;
  constexpr int kWarps = 4;
  const dim3 grid(static_cast<unsigned>((rows + kWarps - 1) / kWarps));
  launch_pdl(dual_chunk_merge_kernel, grid, kWarps * 32, 0, stream, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
