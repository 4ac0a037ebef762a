// moe_gemm (moe_kernels.h): a grouped GEMM over the expert-sorted row blocks of moe_align, on
// mma.sync bf16 tensor cores with a cp.async pipeline (vLLM's and SGLang's fused_moe design,
// written for specula's f32-accurate activations: each A tile is the hi and the lo bf16 term of
// the f32 rows, both multiplied by the same weight fragments, so the weights are read once).
//
// Programmatic dependent launch: the block list comes from moe_align, two launches back, which
// has completed when this kernel starts (cuda_pdl.cuh); so a block reads its expert and starts
// streaming that expert's weights at once, and waits for the previous kernel (the split of x, or
// the gate|up product) only before its activation rows.
//
// A block owns block_m rows of one expert and bn output columns. Rows come from the token's
// activations (gather, the gate|up product) or from the rows themselves (the down product);
// padding rows (pair -1) read zeros. Shared rows are padded by 8 bf16 (16 bytes), which keeps
// ldmatrix free of bank conflicts for both tile widths.
#include <cuda_bf16.h>

#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"
#include "specula/core/error.h"
#include "specula/model/cuda/activation.cuh"
#include "specula/model/cuda/fp8_operand.cuh"
#include "specula/model/cuda/moe_kernels.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kPad = 8;

// kMinBlocks: blocks per multiprocessor the registers must allow (mma.sync hides its latency
// with other warps, not with a deeper register pipeline).
template <int kBm, int kBn, int kBk, int kWm, int kWn, int kStages, int kMinBlocks>
struct Tile {
  static constexpr int bm = kBm, bn = kBn, bk = kBk, wn = kWn, stages = kStages, min_blocks = kMinBlocks;
  static constexpr int threads = 32 * kWm * kWn;
  static constexpr int lds = kBk + kPad;  // bf16 per shared row
  static constexpr int warp_m = kBm / kWm, warp_n = kBn / kWn;
  static constexpr int mt = warp_m / 16, nt = warp_n / 8;
  static_assert(warp_m % 16 == 0 && warp_n % 16 == 0 && kBk % 16 == 0 && kBn % 64 == 0);
  static constexpr size_t pipeline_bytes = sizeof(__nv_bfloat16) * kStages * (2 * kBm + kBn) * lds;
  static constexpr size_t epilogue_bytes = sizeof(float) * kBm * (kBn + 4);
  static constexpr size_t smem_bytes = pipeline_bytes > epilogue_bytes ? pipeline_bytes : epilogue_bytes;
};

// Decode: 4 stages of 64-deep k tiles keep 32 KB of weights in flight per block. Prefill: 3
// stages, so that two blocks (16 warps) share a multiprocessor.
using SmallTile = Tile<16, 64, 64, 1, 4, 4, 2>;
using MediumTile = Tile<64, 128, 32, 2, 4, 3, 2>;
// (H200, DeepSeek-V2-Lite and Qwen3-30B-A3B at 4096 tokens: 128 x 256 tiles with 64 x 64 warp
// tiles, and 64-deep k tiles at one block per SM, took 12-16% longer than this one.)
using LargeTile = Tile<128, 128, 32, 2, 4, 3, 2>;
static_assert(LargeTile::bm == 128, "moe_gemm_wgmma's blocks are the large tile's 128 rows");
// fp8 weights, prefill: 64-deep k tiles (H200, 4096 tokens of DeepSeek-V2-Lite's shape: 5.6 ms
// against 6.6 ms at 32). Decode keeps the bf16 tiles: twice as deep ones, which bring a bf16
// stage's bytes, were slower (batch 1: 88 us of GEMMs against 76 us), the fragments' conversion
// in every warp, not the bytes in flight, being what limits them.
using LargeFp8Tile = Tile<128, 128, 64, 2, 4, 3, 1>;

// 4-byte global -> shared copy; with valid == false nothing is read and zeros are written.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* global_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem_dst)), "l"(global_src),
               "r"(valid ? 4 : 0));
}

// kFp8: B tiles hold e4m3 codes (rows of bk bytes + 16 of padding) and, after them, each row's
// scale for each 16 values of k, both brought in by the cp.async pipeline; codes become bf16
// fragments as they are read from shared memory. Otherwise bf16 rows read with ldmatrix. (The conversion's
// registers do not fit two large-tile blocks per SM without spilling: fp8 asks for one.)
template <class T, bool kFp8>
__global__ void __launch_bounds__(T::threads, kFp8 ? 1 : T::min_blocks) moe_gemm_kernel(MoeGemmParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int row_src[T::bm];
  const int block = blockIdx.y;
  if (block >= *p.num_blocks) {
    pdl_wait();
    pdl_trigger();
    return;
  }
  const int expert = p.block_expert[block];
  const int n0 = blockIdx.x * T::bn;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / T::wn, wn = warp % T::wn;
  auto* a_hi_s = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* a_lo_s = a_hi_s + T::stages * T::bm * T::lds;
  __nv_bfloat16* b_s = a_lo_s + T::stages * T::bm * T::lds;
  auto* b_codes = reinterpret_cast<unsigned char*>(b_s);
  constexpr int kLdb = T::bk + 16;  // bytes per row of an fp8 B tile
  constexpr int kSteps = T::bk / 16;  // k16 steps per k tile
  auto* scale_s = reinterpret_cast<float*>(b_codes + T::stages * T::bn * kLdb);  // [stages][bn][kSteps]
  static_assert(T::bn * (kLdb + 4 * kSteps) <= T::bn * T::lds * 2, "fp8 codes and scales fit the bf16 B tile");
  for (int i = tid; i < T::bm; i += T::threads) {
    const int64_t r = static_cast<int64_t>(block) * T::bm + i;
    const int pair = p.sorted[r];
    row_src[i] = pair < 0 ? -1 : (p.gather ? pair / p.top_k : static_cast<int>(r));
  }
  __syncthreads();
  // Padding rows are zero in every stage, written once: load_a issues no copy for them (a
  // zero-filling cp.async is still an instruction and a request; at decode 15 of the small tile's
  // 16 rows are padding). H200, 1 token of DeepSeek-V2-Lite: grouped GEMMs 55.3 -> 54.3 us.
  for (int c = tid; c < T::stages * T::bm * (T::bk / 8); c += T::threads) {
    const int r = (c / (T::bk / 8)) % T::bm;
    if (row_src[r] >= 0) continue;
    const int at = (c / (T::bk / 8)) * T::lds + (c % (T::bk / 8)) * 8;
    *reinterpret_cast<uint4*>(a_hi_s + at) = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(a_lo_s + at) = make_uint4(0, 0, 0, 0);
  }
  const auto* a_hi = static_cast<const __nv_bfloat16*>(p.a_hi);
  const auto* a_lo = static_cast<const __nv_bfloat16*>(p.a_lo);
  const auto* w = static_cast<const __nv_bfloat16*>(p.w) + static_cast<int64_t>(expert) * p.n * p.k;
  const auto* codes = static_cast<const unsigned char*>(p.w) + static_cast<int64_t>(expert) * p.n * p.k;
  const int k_blocks = kFp8 ? (p.k + p.scale_k - 1) / p.scale_k : 0;
  const float* scales = kFp8 ? p.w_scale + static_cast<int64_t>(expert) * p.n * k_blocks : nullptr;
  const int k_tiles = (p.k + T::bk - 1) / T::bk;
  constexpr int kChunks = T::bk / 8;  // 16-byte chunks per row of a k tile

  auto load_a = [&](int stage, int kt) {
    const int k0 = kt * T::bk;
    for (int c = tid; c < T::bm * kChunks; c += T::threads) {
      const int r = c / kChunks, kk = k0 + (c % kChunks) * 8;
      const int src = row_src[r];
      if (src < 0) continue;
      const bool valid = kk < p.k;
      const int64_t off = valid ? static_cast<int64_t>(src) * p.k + kk : 0;
      const int dst = (stage * T::bm + r) * T::lds + (c % kChunks) * 8;
      cp_async_16(a_hi_s + dst, a_hi + off, valid);
      cp_async_16(a_lo_s + dst, a_lo + off, valid);
    }
  };
  auto load_b = [&](int stage, int kt) {
    const int k0 = kt * T::bk;
    if constexpr (kFp8) {
      constexpr int kCodeChunks = T::bk / 16;
      for (int c = tid; c < T::bn * kCodeChunks; c += T::threads) {
        const int r = c / kCodeChunks, kk = k0 + (c % kCodeChunks) * 16;
        const bool valid = n0 + r < p.n && kk < p.k;
        const int64_t off = valid ? static_cast<int64_t>(n0 + r) * p.k + kk : 0;
        cp_async_16(b_codes + (stage * T::bn + r) * kLdb + (c % kCodeChunks) * 16, codes + off, valid);
      }
      for (int c = tid; c < T::bn * kSteps; c += T::threads) {
        const int r = c / kSteps, kk = k0 + (c % kSteps) * 16;
        const bool valid = n0 + r < p.n && kk < p.k;
        const int64_t off = valid ? static_cast<int64_t>(n0 + r) * k_blocks + kk / p.scale_k : 0;
        cp_async_4(scale_s + (stage * T::bn + r) * kSteps + c % kSteps, scales + off, valid);
      }
    } else {
      for (int c = tid; c < T::bn * kChunks; c += T::threads) {
        const int r = c / kChunks, kk = k0 + (c % kChunks) * 8;
        const bool valid = n0 + r < p.n && kk < p.k;
        const int64_t off = valid ? static_cast<int64_t>(n0 + r) * p.k + kk : 0;
        cp_async_16(b_s + (stage * T::bn + r) * T::lds + (c % kChunks) * 8, w + off, valid);
      }
    }
  };

  float acc[T::mt][T::nt][4] = {};
  // The first stages' weights before the wait; each stage's group then closes with its rows (the
  // first group holds all the early weights).
  for (int s = 0; s < T::stages - 1; ++s) {
    if (s < k_tiles) load_b(s, s);
  }
  pdl_wait();
  pdl_trigger();
  for (int s = 0; s < T::stages - 1; ++s) {
    if (s < k_tiles) load_a(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<T::stages - 2>();
    __syncthreads();
    const int next = kt + T::stages - 1;
    if (next < k_tiles) {
      load_a(next % T::stages, next);
      load_b(next % T::stages, next);
    }
    cp_async_commit();
    const int stage = kt % T::stages;
#pragma unroll
    for (int kk = 0; kk < T::bk; kk += 16) {
      uint32_t ah[T::mt][4], al[T::mt][4];
#pragma unroll
      for (int m = 0; m < T::mt; ++m) {
        const int row = wm * T::warp_m + m * 16 + lane % 16;
        const int at = (stage * T::bm + row) * T::lds + kk + (lane / 16) * 8;
        ldmatrix_x4(ah[m], a_hi_s + at);
        ldmatrix_x4(al[m], a_lo_s + at);
      }
      if constexpr (kFp8) {
#pragma unroll
        for (int j = 0; j < T::nt; ++j) {
          const int col = wn * T::warp_n + j * 8 + lane / 4;
          const unsigned char* at = b_codes + (stage * T::bn + col) * kLdb + kk + 2 * (lane % 4);
          const float scale = scale_s[(stage * T::bn + col) * kSteps + kk / 16];
          const uint32_t b0 = fp8x2_to_bf16x2(*reinterpret_cast<const uint16_t*>(at), scale);
          const uint32_t b1 = fp8x2_to_bf16x2(*reinterpret_cast<const uint16_t*>(at + 8), scale);
#pragma unroll
          for (int m = 0; m < T::mt; ++m) {
            mma_16816<__nv_bfloat16>(acc[m][j], ah[m], b0, b1);
            mma_16816<__nv_bfloat16>(acc[m][j], al[m], b0, b1);
          }
        }
      } else {
#pragma unroll
        for (int np = 0; np < T::nt / 2; ++np) {
          uint32_t b[4];
          const int j = lane / 8;
          const int row = wn * T::warp_n + np * 16 + (j / 2) * 8 + lane % 8;
          ldmatrix_x4(b, b_s + (stage * T::bn + row) * T::lds + kk + (j % 2) * 8);
#pragma unroll
          for (int m = 0; m < T::mt; ++m) {
            mma_16816<__nv_bfloat16>(acc[m][2 * np], ah[m], b[0], b[1]);
            mma_16816<__nv_bfloat16>(acc[m][2 * np], al[m], b[0], b[1]);
            mma_16816<__nv_bfloat16>(acc[m][2 * np + 1], ah[m], b[2], b[3]);
            mma_16816<__nv_bfloat16>(acc[m][2 * np + 1], al[m], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  const int g = lane / 4, t4 = lane % 4;
  const int64_t row0 = static_cast<int64_t>(block) * T::bm;
  if (!p.gate_up) {
#pragma unroll
    for (int m = 0; m < T::mt; ++m) {
#pragma unroll
      for (int n = 0; n < T::nt; ++n) {
        const int col = n0 + wn * T::warp_n + n * 8 + 2 * t4;
        if (col >= p.n) continue;
        const int r = wm * T::warp_m + m * 16 + g;
        *reinterpret_cast<float2*>(p.out + (row0 + r) * p.n + col) = make_float2(acc[m][n][0], acc[m][n][1]);
        *reinterpret_cast<float2*>(p.out + (row0 + r + 8) * p.n + col) = make_float2(acc[m][n][2], acc[m][n][3]);
      }
    }
    return;
  }
  // gate|up: the tile through shared memory, so that each gate column meets its up column
  // (32 columns further on), then act = silu(gate) * up as hi / lo bf16.
  __syncthreads();
  auto* c_s = reinterpret_cast<float*>(smem);
  constexpr int kLdc = T::bn + 4;
#pragma unroll
  for (int m = 0; m < T::mt; ++m) {
#pragma unroll
    for (int n = 0; n < T::nt; ++n) {
      const int r = wm * T::warp_m + m * 16 + g, c = wn * T::warp_n + n * 8 + 2 * t4;
      c_s[r * kLdc + c] = acc[m][n][0];
      c_s[r * kLdc + c + 1] = acc[m][n][1];
      c_s[(r + 8) * kLdc + c] = acc[m][n][2];
      c_s[(r + 8) * kLdc + c + 1] = acc[m][n][3];
    }
  }
  __syncthreads();
  const int inter = p.n / 2;
  auto* act_hi = static_cast<__nv_bfloat16*>(p.act_hi);
  auto* act_lo = static_cast<__nv_bfloat16*>(p.act_lo);
  for (int i = tid; i < T::bm * (T::bn / 2); i += T::threads) {
    const int r = i / (T::bn / 2), c = i % (T::bn / 2);
    const int local = (c / 32) * 64 + c % 32;
    const float a = gate_activation(c_s[r * kLdc + local], false) * c_s[r * kLdc + local + 32];
    const int col = n0 / 2 + c;
    if (col >= inter) continue;
    const __nv_bfloat16 hi = __float2bfloat16_rn(a);
    const int64_t at = (row0 + r) * inter + col;
    act_hi[at] = hi;
    act_lo[at] = __float2bfloat16_rn(a - __bfloat162float(hi));
  }
}

template <class T, bool kFp8>
void launch_as(const MoeGemmParams& p, cudaStream_t s) {
  raise_dynamic_smem(moe_gemm_kernel<T, kFp8>, T::smem_bytes);
  SPECULA_CHECK(p.max_blocks <= 65535, "moe_gemm: {} row blocks (at most 65535)", p.max_blocks);
  const dim3 grid(static_cast<unsigned>((p.n + T::bn - 1) / T::bn), static_cast<unsigned>(p.max_blocks));
  launch_pdl(moe_gemm_kernel<T, kFp8>, grid, T::threads, T::smem_bytes, s, p);
  CUDA_CHECK(cudaGetLastError());
}

template <class T, class Fp8T>
void launch(const MoeGemmParams& p, cudaStream_t s) {
  static_assert(T::bm == Fp8T::bm, "both tiles of a kind cover the rows moe_align padded to");
  if (p.w_scale != nullptr) return launch_as<Fp8T, true>(p, s);
  launch_as<T, false>(p, s);
}

}  // namespace

int moe_tile_rows(MoeTile tile) {
  switch (tile) {
    case MoeTile::kSmall:
      return SmallTile::bm;
    case MoeTile::kMedium:
      return MediumTile::bm;
    case MoeTile::kLarge:
      return LargeTile::bm;
  }
  return LargeTile::bm;
}

MoeTile moe_pick_tile(int64_t pairs, int experts) {
  // Rows per expert on average: below 16 a 16-row block wastes little; far above, the large
  // tile's reuse of each weight fragment pays.
  const int64_t mean = pairs / (experts > 0 ? experts : 1);
  if (mean <= 16) return MoeTile::kSmall;
  if (mean <= 96) return MoeTile::kMedium;
  return MoeTile::kLarge;
}

void moe_gemm(const MoeGemmParams& p, MoeTile tile, cudaStream_t s) {
  if (p.max_blocks == 0) return;
  SPECULA_CHECK(p.k % 8 == 0 && p.n % 8 == 0 && (!p.gate_up || p.n % 64 == 0),
                "moe_gemm: an [{}, {}] expert matrix (widths must be multiples of 8, gate|up rows of 64)", p.n, p.k);
  SPECULA_CHECK(p.w_scale == nullptr || (p.k % 16 == 0 && p.scale_k > 0 && p.scale_k % 16 == 0),
                "moe_gemm: fp8 weights need k ({}) and the scale run ({}) in multiples of 16", p.k, p.scale_k);
  const bool wgmma = tile == MoeTile::kLarge && p.experts > 0 && !p.mma_sync && !p.gather;
  SPECULA_CHECK(p.a_lo != nullptr || wgmma,
                "moe_gemm: activations without their lo term need the large tile on warpgroup MMA");
  if (wgmma) return moe_gemm_wgmma(p, s);
  if (tile == MoeTile::kSmall && p.experts > 0 && !p.mma_sync && p.w_scale == nullptr && p.a_lo != nullptr) {
    return moe_gemm_decode(p, s);
  }
  switch (tile) {
    case MoeTile::kSmall:
      return launch<SmallTile, SmallTile>(p, s);
    case MoeTile::kMedium:
      return launch<MediumTile, MediumTile>(p, s);
    case MoeTile::kLarge:
      return launch<LargeTile, LargeFp8Tile>(p, s);
  }
}

}  // namespace specula::cuda_kernels
