// MLA cache-write kernels. Latent rows: one 128-thread block per token; for fp8_ds_mla each warp
// quantises whole 128-value tiles (4 values per lane, the tile max by a warp shuffle), then all
// threads write the bf16 RoPE part. Indexer keys: one warp per token.
//
// Bit-identity with the host encoder (finite inputs): the tile max is exact whatever the
// reduction order; the scale and x / scale are single IEEE divisions (__fdiv_rn, so no fast-math
// reciprocal can creep in); the clamp has std::clamp's form; the fp8 and bf16 conversions are
// round-to-nearest-even, as are float_to_fp8_e4m3_bits and float_to_bf16_bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "specula/core/dtype_codes.h"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/kv/cuda/mla_set_kv_buffer.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kValuesPerLane = kMlaFp8Tile / 32;
constexpr float kFp8Max = 448.0f;

__device__ __forceinline__ float load_float(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// scale = amax / 448; 1 when that is zero (an all-zero tile, or a max so small that the division
// underflows), so that x / scale never computes 0 / 0.
__device__ __forceinline__ float tile_scale(float amax) {
  const float scale = __fdiv_rn(amax, kFp8Max);
  return scale == 0.0f ? 1.0f : scale;
}

__device__ __forceinline__ uint8_t quantise(float x, float scale) {
  const float q = __fdiv_rn(x, scale);
  // std::clamp's comparisons: NaN passes through (and stays NaN); fminf/fmaxf would turn it into
  // -448. Saturating matters when a subnormal scale lost precision and x / scale exceeds 448.
  const float c = q < -kFp8Max ? -kFp8Max : (kFp8Max < q ? kFp8Max : q);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(c, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ void store_bf16(uint8_t* dst, float v) {
  *reinterpret_cast<__nv_bfloat16*>(dst) = __float2bfloat16_rn(v);
}

__global__ void mla_set_kv_kernel(MlaSetKVParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t token = blockIdx.x;
  uint8_t* row = static_cast<uint8_t*>(p.cache) + static_cast<int64_t>(p.loc[token]) * p.row_bytes;
  const void* kv_c = static_cast<const char*>(p.kv_c) + token * p.kv_c_stride * (p.kv_c_dtype == kF32 ? 4 : 2);
  const void* k_pe = static_cast<const char*>(p.k_pe) + token * p.k_pe_stride * (p.k_pe_dtype == kF32 ? 4 : 2);
  const int r = p.kv_lora_rank;
  if (p.format == kMlaRowBf16) {
    for (int i = static_cast<int>(threadIdx.x); i < r + p.qk_rope_head_dim; i += kThreads) {
      const float v = i < r ? load_float(kv_c, p.kv_c_dtype, i) : load_float(k_pe, p.k_pe_dtype, i - r);
      store_bf16(row + 2 * static_cast<int64_t>(i), v);
    }
    return;
  }
  // fp8_ds_mla: [r fp8][r / 128 f32 scales][qk_rope_head_dim bf16].
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  auto* scales = reinterpret_cast<float*>(row + r);
  for (int tile = warp; tile < r / kMlaFp8Tile; tile += kWarps) {
    float x[kValuesPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kValuesPerLane; ++j) {
      x[j] = load_float(kv_c, p.kv_c_dtype, tile * kMlaFp8Tile + j * 32 + lane);
      amax = fmaxf(amax, fabsf(x[j]));
    }
    const float scale = tile_scale(warp_max(amax));
#pragma unroll
    for (int j = 0; j < kValuesPerLane; ++j) row[tile * kMlaFp8Tile + j * 32 + lane] = quantise(x[j], scale);
    if (lane == 0) scales[tile] = scale;
  }
  uint8_t* rope = row + r + 4 * (r / kMlaFp8Tile);
  for (int i = static_cast<int>(threadIdx.x); i < p.qk_rope_head_dim; i += kThreads) {
    store_bf16(rope + 2 * i, load_float(k_pe, p.k_pe_dtype, i));
  }
}

__global__ void mla_set_index_k_kernel(MlaSetIndexKParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (token >= p.num_tokens) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int d = p.index_head_dim;
  uint8_t* row = static_cast<uint8_t*>(p.cache) + static_cast<int64_t>(p.loc[token]) * (d + 4);
  const void* k = static_cast<const char*>(p.k) + token * p.k_stride * (p.k_dtype == kF32 ? 4 : 2);
  // Two passes over the key (max, then quantise): the second reads hit L1.
  float amax = 0.0f;
  for (int i = lane; i < d; i += 32) amax = fmaxf(amax, fabsf(load_float(k, p.k_dtype, i)));
  const float scale = tile_scale(warp_max(amax));
  for (int i = lane; i < d; i += 32) row[i] = quantise(load_float(k, p.k_dtype, i), scale);
  // d is a multiple of 16 and rows are d + 4 bytes, so the scale is 4-byte aligned.
  if (lane == 0) *reinterpret_cast<float*>(row + d) = scale;
}

bool is_source_dtype(int32_t dtype) { return dtype == kF32 || dtype == kF16 || dtype == kBF16; }

}  // namespace

void launch_mla_set_kv_buffer(const MlaSetKVParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return;
  SPECULA_REQUIRE(is_source_dtype(p.kv_c_dtype) && is_source_dtype(p.k_pe_dtype),
                  "mla_set_kv_buffer: source dtype codes " + std::to_string(p.kv_c_dtype) + " / " +
                      std::to_string(p.k_pe_dtype) + " are not supported; supported: f32, f16, bf16");
  SPECULA_REQUIRE(p.format == kMlaRowBf16 || (p.format == kMlaRowFp8DsMla && p.kv_lora_rank % kMlaFp8Tile == 0 &&
                                              p.qk_rope_head_dim % 2 == 0),
                  "mla_set_kv_buffer: format " + std::to_string(p.format) + " with kv_lora_rank " +
                      std::to_string(p.kv_lora_rank) + " and qk_rope_head_dim " + std::to_string(p.qk_rope_head_dim) +
                      " is not supported; fp8_ds_mla needs a multiple of 128 and an even RoPE dim");
  launch_pdl(mla_set_kv_kernel, static_cast<unsigned>(p.num_tokens), kThreads, 0, stream, p);
  CUDA_CHECK(cudaGetLastError());
}

void launch_mla_set_index_k(const MlaSetIndexKParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return;
  SPECULA_REQUIRE(is_source_dtype(p.k_dtype), "mla_set_index_k: source dtype code " + std::to_string(p.k_dtype) +
                                                  " is not supported; supported: f32, f16, bf16");
  SPECULA_REQUIRE(p.index_head_dim > 0 && p.index_head_dim % 16 == 0,
                  "mla_set_index_k: index_head_dim " + std::to_string(p.index_head_dim) +
                      " is not supported; it must be a positive multiple of 16");
  const auto blocks = static_cast<unsigned>((p.num_tokens + kWarps - 1) / kWarps);
  launch_pdl(mla_set_index_k_kernel, blocks, kThreads, 0, stream, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
