// One warp per row: 576 values, 18 per lane, reads and writes coalesced across the warp.
#include "specula/attention/mla/cuda/kernels/gather_latent.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "specula/attention/mla/cuda/kernels/mla_attention.h"
#include "specula/core/cuda_check.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kWarps = 8;
constexpr int kTile = 128;  // fp8_ds_mla values per f32 scale

__global__ void gather_latent_kernel(const GatherLatentParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.rows) return;
  const int lane = threadIdx.x & 31;
  const uint8_t* src = p.cache + static_cast<int64_t>(p.slots[row]) * p.row_bytes;
  __nv_bfloat16* kv_c = static_cast<__nv_bfloat16*>(p.kv_c) + row * kMlaLoraRank;
  __nv_bfloat16* k_pe = static_cast<__nv_bfloat16*>(p.k_pe) + row * kMlaRopeDim;
  const auto* rope = reinterpret_cast<const __nv_bfloat16*>(
      p.fp8 ? src + kMlaLoraRank + 4 * (kMlaLoraRank / kTile) : src + 2 * kMlaLoraRank);
  if (p.fp8) {
    const auto* values = reinterpret_cast<const __nv_fp8_e4m3*>(src);
    const auto* scales = reinterpret_cast<const float*>(src + kMlaLoraRank);
    for (int i = lane; i < kMlaLoraRank; i += 32) {
      kv_c[i] = __float2bfloat16_rn(static_cast<float>(values[i]) * scales[i / kTile]);
    }
  } else {
    const auto* values = reinterpret_cast<const __nv_bfloat16*>(src);
    for (int i = lane; i < kMlaLoraRank; i += 32) kv_c[i] = values[i];
  }
  for (int i = lane; i < kMlaRopeDim; i += 32) k_pe[i] = rope[i];
}

}  // namespace

void launch_gather_latent(const GatherLatentParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const auto blocks = static_cast<unsigned>((p.rows + kWarps - 1) / kWarps);
  gather_latent_kernel<<<blocks, 32 * kWarps, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
