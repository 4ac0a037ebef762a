// moe_gemm_decode (moe_kernels.h): moe_gemm's small tile (decode: a few rows per expert) on
// Hopper's warpgroup MMA with the operands swapped, the expert's weights as the M side.
//
// Why: on mma.sync (moe_gemm.cu) the small tile's 16 rows are the M side of m16n8k16, so each 8
// columns x 16 of k of weights (256 bytes) cost two tensor-core instructions (hi and lo), plus
// ldmatrix and the cp.async address arithmetic of every thread: Nsight Compute found that kernel
// issue-bound (an instruction every 2.2 cycles per scheduler, 2.7 warps each, DRAM at 52-57%),
// not short of bytes in flight. Here TMA brings each k tile of weights with one instruction and
// one m64n16k16 wgmma multiplies 64 columns x 16 of k (2 KiB) by all 16 rows.
//
// A block owns 16 rows of one expert (moe_align's small blocks) and 64 output columns:
// - a producer warp fills a ring of stages (5 or 3, below): the expert's [64 x 64] k tile of weights by
//   TMA (128-byte swizzle, a 3-D map over [experts, n, k], so columns past n and k past its end
//   land as zeros) and the rows' hi and lo [16 x 64] tiles by cp.async, valid rows only (the
//   padding rows' zeros are written into every stage once, at the start). A stage's `full`
//   barrier counts the TMA bytes and one arrival per producer lane (its copies landed);
//   `empty` one arrival per consumer warp.
// - one consumer warpgroup: per k tile 4 k16 steps of m64n16k16 over the hi and the lo term (the
//   same weights for both), one tile's batch kept in flight.
// - the epilogue goes through shared memory (the accumulators hold a column per row of the
//   tile), then writes rows: act = silu(gate) * up as hi / lo bf16 (the block's 64 columns are
//   32 gate rows and their 32 up rows, moe_gemm's interleave) or f32 rows.
//
// Each output is the sum over k of the same products in the same order as every other tile (k16
// steps in turn, hi before lo, f32 accumulation), whichever rows share the block; only the
// operands' roles in the instruction differ (tested bit for bit against the large tile).
#include <cuda.h>
#include <cuda_bf16.h>

#include "specula/attention/cuda/kernels/cluster.cuh"
#include "specula/attention/cuda/kernels/tensor_map.h"
#include "specula/attention/cuda/kernels/tma.cuh"
#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"
#include "specula/core/error.h"
#include "specula/model/cuda/activation.cuh"
#include "specula/model/cuda/moe_kernels.h"
#include "specula/model/cuda/stage_ring.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kRows = 16, kCols = 64, kBk = 64;
// Stages per block, by the grid: when its blocks fit three a multiprocessor (batch 1), 5 stages
// keep 4 k tiles (32 KiB of weights) in flight per block and three blocks of 66 KiB still fit;
// when they do not (several waves), 3 stages (41 KiB) let five blocks share a multiprocessor.
// (H200, grouped GEMMs us at 1 / 8 tokens, DeepSeek-V2-Lite and Qwen3-30B-A3B: 3 stages 48.2 /
// 174.6 and 34.4 / 135.0; 4: 45.8 / 185.8 and 32.0 / 144.6; 5: 45.6 / 192.1 and 31.4 / 151.7;
// 6, two blocks a multiprocessor: 53.3 / 199.8 and 28.8 / 156.4, and 8 the same within 0.5 us.
// Qwen3's 216 gate|up blocks at batch 1 fit two a multiprocessor and gain from 6 stages, but
// V2-Lite's 352 then run in two waves: 5 is the depth at which neither loses much.)
constexpr int kDeepStages = 5, kShallowStages = 3, kDeepBlocksPerSm = 3;
constexpr int kConsumerThreads = 128, kThreads = kConsumerThreads + 32;
constexpr int kWTileBytes = kCols * kBk * 2;
constexpr int kXTileBytes = kRows * kBk * 2;
constexpr int kStageBytes = kWTileBytes + 2 * kXTileBytes;
constexpr int kLdc = kCols + 4;  // floats per row of the epilogue's tile
template <int kStages>
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes + sizeof(float) * kRows * kLdc + 1024;
static_assert(kStageBytes % 1024 == 0, "every tile starts on a swizzle period");

template <int kStages>
__global__ void __launch_bounds__(kThreads, kStages == kDeepStages ? kDeepBlocksPerSm : 5)
    moe_gemm_decode_kernel(const MoeGemmParams p, const __grid_constant__ CUtensorMap w_map) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  __shared__ int row_src[kRows];
  const int block = blockIdx.y;
  if (block >= *p.num_blocks) {
    pdl_wait();
    pdl_trigger();
    return;
  }
  unsigned char* ring = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  auto w_tile = [&](int s) { return ring + s * kStageBytes; };
  auto x_hi_tile = [&](int s) { return ring + s * kStageBytes + kWTileBytes; };
  auto x_lo_tile = [&](int s) { return ring + s * kStageBytes + kWTileBytes + kXTileBytes; };
  auto* c_s = reinterpret_cast<float*>(ring + kStages * kStageBytes);
  const int expert = p.block_expert[block];
  const int n0 = blockIdx.x * kCols;
  const int k_tiles = (p.k + kBk - 1) / kBk;
  const int tid = threadIdx.x, lane = tid & 31;
  // The block list is moe_align's, two or more launches back: complete when this kernel starts
  // (cuda_pdl.cuh).
  if (tid < kRows) {
    const int64_t r = static_cast<int64_t>(block) * kRows + tid;
    const int pair = p.sorted[r];
    row_src[tid] = pair < 0 ? -1 : (p.gather ? pair / p.top_k : static_cast<int>(r));
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1 + 32);
      mbarrier_init(&empty[s], kConsumerThreads / 32);
    }
    fence_mbarrier_init_cluster();
  }
  __syncthreads();
  // The padding rows' zeros in every stage, before any wgmma reads a stage (the async proxy).
  for (int c = tid; c < kStages * 2 * kRows * (kBk / 8); c += kThreads) {
    const int chunk = c % (kBk / 8), r = (c / (kBk / 8)) % kRows, t = c / (kBk / 8) / kRows;
    if (row_src[r] >= 0) continue;
    unsigned char* tile = (t % 2 == 0 ? x_hi_tile(t / 2) : x_lo_tile(t / 2));
    *reinterpret_cast<uint4*>(tile + swizzled_offset(kRows, r, chunk * 8)) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
  __syncthreads();

  if (tid >= kConsumerThreads) {
    const auto* x_hi = static_cast<const __nv_bfloat16*>(p.a_hi);
    const auto* x_lo = static_cast<const __nv_bfloat16*>(p.a_lo);
    auto load_w = [&](int kt) {
      const int s = kt % kStages;
      mbarrier_arrive_expect_tx(&full[s], kWTileBytes);
      tma_load_3d(w_tile(s), &w_map, kt * kBk, n0, expert, &full[s]);
    };
    // Lane l copies chunks l, l + 32, ... of the valid rows' (row, 16-byte chunk) pairs.
    auto load_x = [&](int kt) {
      const int s = kt % kStages;
#pragma unroll
      for (int i = 0; i < kRows * (kBk / 8) / 32; ++i) {
        const int c = lane + 32 * i, r = c / (kBk / 8), chunk = c % (kBk / 8);
        const int src = row_src[r];
        if (src < 0) continue;
        const int kk = kt * kBk + chunk * 8;
        const bool valid = kk < p.k;
        const int64_t off = valid ? static_cast<int64_t>(src) * p.k + kk : 0;
        const int at = swizzled_offset(kRows, r, chunk * 8);
        cp_async_16(x_hi_tile(s) + at, x_hi + off, valid);
        cp_async_16(x_lo_tile(s) + at, x_lo + off, valid);
      }
      mbarrier_arrive_cp_async(&full[s]);
    };
    fill_stage_ring<kStages>(
        k_tiles, empty,
        [&](int kt) {
          if (lane == 0) load_w(kt);
        },
        load_x);
    // No copy may be in flight when this thread exits (wait_group waits for committed groups only).
    cp_async_commit();
    cp_async_wait<0>();
    return;
  }

  const int warp = tid / 32;
  float acc[kRows / 8][4] = {};
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    mbarrier_wait(&full[s], (kt / kStages) & 1);
    fence_proxy_async();  // the rows came by cp.async (the generic proxy)
    const uint32_t w_addr = smem_address(w_tile(s));
    const uint32_t hi_addr = smem_address(x_hi_tile(s)), lo_addr = smem_address(x_lo_tile(s));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBk / 16; ++ks) {
      const uint64_t w = wgmma_desc(w_addr + ks * 32, 0);
      wgmma_ss<kRows, __nv_bfloat16>(acc, w, wgmma_desc(hi_addr + ks * 32, 0), 1);
      wgmma_ss<kRows, __nv_bfloat16>(acc, w, wgmma_desc(lo_addr + ks * 32, 0), 1);
    }
    wgmma_commit();
    // The previous tile's batch has completed once at most this one is pending: its stage is free.
    wgmma_wait<1>();
    if (kt > 0 && lane == 0) mbarrier_arrive(&empty[(kt - 1) % kStages]);
  }
  wgmma_wait<0>();
  fence_operands(acc);

  // acc[j][e]: column 16 warp + g (+ 8 for e >= 2) of the tile, row 8 j + 2 t4 (+ 1 for odd e).
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int j = 0; j < kRows / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 16 * warp + g + 8 * (e / 2), row = 8 * j + 2 * t4 + (e % 2);
      c_s[row * kLdc + col] = acc[j][e];
    }
  }
  named_barrier_sync(1, kConsumerThreads);
  const int64_t row0 = static_cast<int64_t>(block) * kRows;
  if (!p.gate_up) {
    for (int i = tid; i < kRows * kCols / 4; i += kConsumerThreads) {
      const int r = i / (kCols / 4), c = (i % (kCols / 4)) * 4;
      if (n0 + c >= p.n) continue;  // n is a multiple of 8: a run of 4 is all in or all out
      const float* v = c_s + r * kLdc + c;
      *reinterpret_cast<float4*>(p.out + (row0 + r) * p.n + n0 + c) = make_float4(v[0], v[1], v[2], v[3]);
    }
    return;
  }
  const int inter = p.n / 2;
  auto* act_hi = static_cast<__nv_bfloat16*>(p.act_hi);
  auto* act_lo = static_cast<__nv_bfloat16*>(p.act_lo);
  for (int i = tid; i < kRows * kCols / 4; i += kConsumerThreads) {
    const int r = i / (kCols / 4), c = (i % (kCols / 4)) * 2;  // two of the 32 gate columns
    const float a0 = gate_activation(c_s[r * kLdc + c], false) * c_s[r * kLdc + c + 32];
    const float a1 = gate_activation(c_s[r * kLdc + c + 1], false) * c_s[r * kLdc + c + 33];
    const __nv_bfloat162 hi = __floats2bfloat162_rn(a0, a1);
    const int64_t at = (row0 + r) * inter + n0 / 2 + c;
    *reinterpret_cast<__nv_bfloat162*>(act_hi + at) = hi;
    *reinterpret_cast<__nv_bfloat162*>(act_lo + at) = __floats2bfloat162_rn(a0 - __low2float(hi), a1 - __high2float(hi));
  }
}

}  // namespace

void moe_gemm_decode(const MoeGemmParams& p, cudaStream_t s) {
  SPECULA_CHECK(p.experts > 0 && p.n > 0 && p.k > 0 && p.k % 8 == 0 && p.n % 8 == 0 && (!p.gate_up || p.n % 64 == 0) &&
                    p.a_lo != nullptr && p.w_scale == nullptr,
                "moe_gemm_decode: bf16 weights of {} experts [n {}, k {}] (multiples of 8; gate|up {}: n a multiple of "
                "64) and activations with their lo term",
                p.experts, p.n, p.k, p.gate_up);
  SPECULA_CHECK(p.max_blocks > 0 && p.max_blocks <= 65535, "moe_gemm_decode: {} row blocks (1 to 65535)", p.max_blocks);
  SPECULA_CHECK(p.decode_stages == 0 || p.decode_stages == kDeepStages || p.decode_stages == kShallowStages,
                "moe_gemm_decode: {} stages (0: by the grid, {} or {})", p.decode_stages, kDeepStages, kShallowStages);
  const uint64_t dims[3] = {static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.experts)};
  const uint64_t strides[2] = {static_cast<uint64_t>(p.k) * 2, static_cast<uint64_t>(p.n) * p.k * 2};
  const uint32_t box[3] = {kBk, kCols, 1};
  const CUtensorMap w_map = swizzled_tensor_map(p.w, true, 3, dims, strides, box, "the experts' weights");
  const dim3 grid(static_cast<unsigned>((p.n + kCols - 1) / kCols), static_cast<unsigned>(p.max_blocks));
  // The current device's (under tensor parallelism each rank's thread drives its own GPU).
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t deep_blocks = static_cast<int64_t>(kDeepBlocksPerSm) * sms;
  const bool deep = p.decode_stages != 0 ? p.decode_stages == kDeepStages
                                          : static_cast<int64_t>(grid.x) * grid.y <= deep_blocks;
  auto go = [&](auto kernel, size_t smem) {
    raise_dynamic_smem(kernel, smem);
    launch_pdl(kernel, grid, dim3(kThreads), smem, s, p, w_map);
  };
  if (deep) {
    go(moe_gemm_decode_kernel<kDeepStages>, kSmemBytes<kDeepStages>);
  } else {
    go(moe_gemm_decode_kernel<kShallowStages>, kSmemBytes<kShallowStages>);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
