// moe_gemm_wgmma (moe_kernels.h): moe_gemm's large tile on Hopper's warpgroup MMA, for bf16 or
// fp8 expert weights, and moe_gather_split, which lays its gate|up rows out for it. This is the
// prefill case: hundreds of rows per expert, so the products are compute-bound, and mma.sync
// (moe_gemm.cu) reached 0.39 of cuBLAS's tensor-core rate there.
//
// A block owns 128 rows of one expert (moe_align's large blocks) and 256 output columns:
// - one producer thread fills a ring of three stages of 128-byte-swizzled tiles (wgmma.cuh) by
//   TMA: the expert's k tile of weights [256 x 64] (a 3-D map over [experts, n, k], so a tile
//   never reads into the next expert and columns past n land as zeros) and the rows' hi and lo
//   tiles [128 x 64] (rows in block-list order: the gate|up rows gathered by moe_gather_split,
//   the down rows as gate|up wrote them). A stage's `full` barrier counts its bytes; its `empty`
//   barrier one arrival per consumer warp (of both blocks, paired). fp8 weights come through the whole producer
//   warpgroup instead, which turns each k tile's codes into the bf16 tile (kFp8 below).
// - two consumer warpgroups of 64 rows each hold their 64 x 256 f32 accumulators in registers;
//   per k tile they issue 4 k16 steps of m64n256k16 products over the hi and the lo term (the
//   same weights for both) and keep one tile's batch in flight, releasing a stage once the batch
//   after it has been issued, so that the tensor cores do not wait on the ring.
// - Where the column tiles pair up, two blocks of neighbouring columns (the same rows, so the
//   same expert) run as a cluster: each loads half of the rows' tiles and multicasts it to both,
//   so the rows are read from L2 once for two blocks. What limits the kernel is the L2's rate:
//   unpaired, each block streams 64 KiB a k tile (A hi and lo, B) for 2048 tensor-core cycles.
//   A stage is then refilled only once the consumers of both blocks have released it.
// The epilogue: with gate and up rows interleaved in runs of 32, gate column c and up column
// c + 32 sit in the same thread's fragments 4 apart, so act = silu(gate) * up is formed in
// registers and written as hi / lo bf16; the down product writes f32 rows.
//
// Each output is a sum over k in a fixed order (k16 steps in turn, hi before lo), whichever rows
// share the block: deterministic, and a row's result does not depend on the batch.
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
#include "specula/model/cuda/fp8_operand.cuh"
#include "specula/model/cuda/moe_kernels.h"
#include "specula/model/cuda/stage_ring.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kBm = 128, kBn = 256, kBk = 64, kStages = 3;
constexpr int kConsumerThreads = 256, kProducerThreads = 128, kThreads = kConsumerThreads + kProducerThreads;
// The producer needs few registers, or with fp8 weights a k tile's codes and scales in flight;
// each consumer thread holds 128 accumulators.
template <bool kFp8>
constexpr int kProducerRegisters = kFp8 ? 120 : 40;
template <bool kFp8>
constexpr int kConsumerRegisters = kFp8 ? 192 : 232;
// What the block is given: 65536 / kThreads per thread, rounded down to a multiple of 8 (168).
constexpr int kBlockRegisters = kThreads * (65536 / kThreads / 8 * 8);
static_assert(kProducerThreads * kProducerRegisters<true> + kConsumerThreads * kConsumerRegisters<true> <=
              kBlockRegisters);
static_assert(kProducerThreads * kProducerRegisters<false> + kConsumerThreads * kConsumerRegisters<false> <=
              kBlockRegisters);
// fp8 weights: each producer thread turns 8 runs of 16 codes of a [256 x 64] k tile into bf16.
constexpr int kFp8Runs = kBn * kBk / 16 / kProducerThreads;
constexpr int kATileBytes = kBm * kBk * 2;
constexpr int kBTileBytes = kBn * kBk * 2;
constexpr int kStageBytes = 2 * kATileBytes + kBTileBytes;
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes + 1024;  // + the ring's alignment

// Producer thread pt's runs first .. first + kRuns - 1 of fp8 k tile kt (codes and their scales,
// zeros past the matrix): run i is row (pt + 128 i) / 4 of the tile, codes 16 ((pt + 128 i) % 4)
// on. Then the same runs as bf16 into the swizzled tile.
template <int kRuns>
__device__ __forceinline__ void fetch_fp8_runs(const unsigned char* codes, const float* scales, int k_blocks,
                                               const MoeGemmParams& p, int n0, int pt, int kt, int first,
                                               uint4 (&v)[kRuns], float (&sc)[kRuns]) {
#pragma unroll
  for (int i = 0; i < kRuns; ++i) {
    const int c = pt + kProducerThreads * (first + i), r = c / 4, kk = kt * kBk + (c % 4) * 16;
    const bool valid = n0 + r < p.n && kk < p.k;
    const int64_t row = n0 + r;
    v[i] = valid ? __ldg(reinterpret_cast<const uint4*>(codes + row * p.k + kk)) : make_uint4(0, 0, 0, 0);
    sc[i] = valid ? __ldg(scales + row * k_blocks + kk / p.scale_k) : 0.0f;
  }
}
template <int kRuns>
__device__ __forceinline__ void store_fp8_runs(unsigned char* tile, int pt, int first, const uint4 (&v)[kRuns],
                                               const float (&sc)[kRuns]) {
#pragma unroll
  for (int i = 0; i < kRuns; ++i) {
    const int c = pt + kProducerThreads * (first + i), r = c / 4, col = (c % 4) * 16;
    const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    uint32_t b[8];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      b[2 * q] = fp8x2_to_bf16x2(static_cast<uint16_t>(w[q] & 0xffffu), sc[i]);
      b[2 * q + 1] = fp8x2_to_bf16x2(static_cast<uint16_t>(w[q] >> 16), sc[i]);
    }
    *reinterpret_cast<uint4*>(tile + swizzled_offset(kBn, r, col)) = make_uint4(b[0], b[1], b[2], b[3]);
    *reinterpret_cast<uint4*>(tile + swizzled_offset(kBn, r, col + 8)) = make_uint4(b[4], b[5], b[6], b[7]);
  }
}

// kLo: the activations are the hi and lo bf16 terms of f32 rows (specula's f32-accurate
// products); otherwise hi alone (bf16 activations, as peers run them; bench moe times it).
// kCluster: blocks of neighbouring column tiles sharing the rows' tiles (1 or 2).
// kFp8: the weights are e4m3 codes with per-row scales (MoeGemmParams); the whole producer
// warpgroup loads each k tile's codes, turns them into the bf16 tile (fp8_operand.cuh: the
// values of the host's dequantization) and arrives on the stage's barrier after a proxy fence.
template <bool kLo, int kCluster, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    moe_gemm_wgmma_kernel(const MoeGemmParams p, const __grid_constant__ CUtensorMap w_map,
                          const __grid_constant__ CUtensorMap a_hi_map, const __grid_constant__ CUtensorMap a_lo_map) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  const int block = blockIdx.y;
  if (block >= *p.num_blocks) {  // the same for both blocks of a cluster (they share blockIdx.y)
    pdl_wait();
    pdl_trigger();
    return;
  }
  unsigned char* ring =
      smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);  // swizzled tiles start on 1 KiB
  auto a_hi_tile = [&](int s) { return ring + s * kStageBytes; };
  auto a_lo_tile = [&](int s) { return ring + s * kStageBytes + kATileBytes; };
  auto b_tile = [&](int s) { return ring + s * kStageBytes + 2 * kATileBytes; };
  const int expert = p.block_expert[block];
  const int n0 = blockIdx.x * kBn;
  const int k_tiles = (p.k + kBk - 1) / kBk;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // The producer's arrival with the stage's TMA bytes, and with fp8 each converting thread's.
      mbarrier_init(&full[s], kFp8 ? 1 + kProducerThreads : 1);
      mbarrier_init(&empty[s], kCluster * kConsumerThreads / 32);
    }
    fence_mbarrier_init_cluster();
  }
  if constexpr (kCluster > 1) {
    cluster_sync();  // the peer's barriers exist before this block multicasts into it
  } else {
    __syncthreads();
  }

  if (tid >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegisters<kFp8>>();
    constexpr int kRowsEach = kBm / kCluster;  // rows of the A tiles this block loads for the cluster
    constexpr uint32_t kStageTx = (kLo ? 2 : 1) * kATileBytes + (kFp8 ? 0 : kBTileBytes);
    const int rank = kCluster > 1 ? static_cast<int>(cluster_rank()) : 0;
    const int row0 = block * kBm + rank * kRowsEach;
    const bool issuer = tid == kConsumerThreads;
    auto load_a = [&](int kt) {
      const int s = kt % kStages;
      const int at = rank * kRowsEach * 128;  // bytes: whole 8-row swizzle atoms
      if constexpr (kCluster > 1) {
        constexpr uint16_t kAll = (1u << kCluster) - 1;
        tma_load_2d_multicast(a_hi_tile(s) + at, &a_hi_map, kt * kBk, row0, &full[s], kAll);
        if constexpr (kLo) tma_load_2d_multicast(a_lo_tile(s) + at, &a_lo_map, kt * kBk, row0, &full[s], kAll);
      } else {
        tma_load_2d(a_hi_tile(s) + at, &a_hi_map, kt * kBk, row0, &full[s]);
        if constexpr (kLo) tma_load_2d(a_lo_tile(s) + at, &a_lo_map, kt * kBk, row0, &full[s]);
      }
    };
    if constexpr (!kFp8) {
      if (issuer) {
        auto load_b = [&](int kt) {
          const int s = kt % kStages;
          mbarrier_arrive_expect_tx(&full[s], kStageTx);
          tma_load_3d(b_tile(s), &w_map, kt * kBk, n0, expert, &full[s]);
        };
        fill_stage_ring<kStages>(k_tiles, empty, load_b, load_a);
      }
    } else {
      const int pt = tid - kConsumerThreads;
      const auto* codes = static_cast<const unsigned char*>(p.w) + static_cast<int64_t>(expert) * p.n * p.k;
      const int k_blocks = (p.k + p.scale_k - 1) / p.scale_k;
      const float* scales = p.w_scale + static_cast<int64_t>(expert) * p.n * k_blocks;
      pdl_wait();
      pdl_trigger();
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        if (kt >= kStages) mbarrier_wait(&empty[s], ((kt / kStages) - 1) & 1);
        if (issuer) {
          mbarrier_arrive_expect_tx(&full[s], kStageTx);
          load_a(kt);
        }
        // The stage's codes, requested once it is free (the ring keeps the producer up to three
        // tiles ahead, which covers their latency), then stored as bf16; in two halves, which
        // keeps the producer's registers within its share.
        constexpr int kHalf = kFp8Runs / 2;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 v[kHalf];
          float sc[kHalf];
          fetch_fp8_runs<kHalf>(codes, scales, k_blocks, p, n0, pt, kt, h * kHalf, v, sc);
          store_fp8_runs<kHalf>(b_tile(s), pt, h * kHalf, v, sc);
        }
        fence_proxy_async();  // the generic proxy's stores, before wgmma reads them
        mbarrier_arrive(&full[s]);
      }
    }
  } else {
    setmaxnreg_inc<kConsumerRegisters<kFp8>>();
    // The consumers neither wait for the previous kernel nor signal the next one (the producer
    // does both, in that order, as cuda_pdl.cuh requires): their outputs are written after the
    // first k tile's rows arrived, which the producer loads only after its wait.
    const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid & 31;
    float acc[kBn / 8][4];
#pragma unroll
    for (int j = 0; j < kBn / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    // An expert's run is padded to whole blocks, so its last block's second half is often padding
    // alone (sorted: the valid rows first): that warpgroup issues no products, and the other one
    // has the tensor cores to itself. Its zero accumulators still write the padding rows' zeros.
    // (Broadcast from lane 0, so that the compiler sees a warp-uniform branch and keeps the
    // products asynchronous.)
    const bool idle = __shfl_sync(0xffffffffu, p.sorted[static_cast<int64_t>(block) * kBm + wg * 64], 0) < 0;
    // Releases stage s here and (its rows multicast) in the peer block.
    auto release = [&](int s) {
      if (lane != 0) return;
      if constexpr (kCluster > 1) {
#pragma unroll
        for (int c = 0; c < kCluster; ++c) mbarrier_arrive_cluster(cluster_map(&empty[s], c));
      } else {
        mbarrier_arrive(&empty[s]);
      }
    };
    if (idle) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        mbarrier_wait(&full[kt % kStages], (kt / kStages) & 1);
        release(kt % kStages);
      }
    } else {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        mbarrier_wait(&full[s], (kt / kStages) & 1);
        const uint32_t a_hi_addr = smem_address(a_hi_tile(s)) + wg * 64 * 128;
        const uint32_t a_lo_addr = smem_address(a_lo_tile(s)) + wg * 64 * 128;
        const uint32_t b_addr = smem_address(b_tile(s));
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kBk / 16; ++ks) {
          const uint64_t b = wgmma_desc(b_addr + ks * 32, 0);
          wgmma_ss<kBn, __nv_bfloat16>(acc, wgmma_desc(a_hi_addr + ks * 32, 0), b, 1);
          if constexpr (kLo) wgmma_ss<kBn, __nv_bfloat16>(acc, wgmma_desc(a_lo_addr + ks * 32, 0), b, 1);
        }
        wgmma_commit();
        // The previous tile's batch has completed once at most this one is pending: its stage is free.
        wgmma_wait<1>();
        if (kt > 0) release((kt - 1) % kStages);
      }
      wgmma_wait<0>();
    }
    fence_operands(acc);

    const int g = lane / 4, t4 = lane % 4;
    const int64_t row = static_cast<int64_t>(block) * kBm + wg * 64 + warp * 16 + g;  // and row + 8
    if (!p.gate_up) {
#pragma unroll
      for (int j = 0; j < kBn / 8; ++j) {
        const int col = n0 + 8 * j + 2 * t4;
        if (col >= p.n) continue;
        *reinterpret_cast<float2*>(p.out + row * p.n + col) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(p.out + (row + 8) * p.n + col) = make_float2(acc[j][2], acc[j][3]);
      }
    } else {
      const int inter = p.n / 2;
      auto* act_hi = static_cast<__nv_bfloat16*>(p.act_hi);
      auto* act_lo = static_cast<__nv_bfloat16*>(p.act_lo);
#pragma unroll
      for (int group = 0; group < kBn / 64; ++group) {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 8 * group + jj;  // gate fragment; its up fragment is j + 4
          const int col = n0 / 2 + 32 * group + 8 * jj + 2 * t4;
          if (col >= inter) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float a0 = gate_activation(acc[j][2 * h], false) * acc[j + 4][2 * h];
            const float a1 = gate_activation(acc[j][2 * h + 1], false) * acc[j + 4][2 * h + 1];
            const __nv_bfloat162 hi = __floats2bfloat162_rn(a0, a1);
            const int64_t at = (row + 8 * h) * inter + col;
            *reinterpret_cast<__nv_bfloat162*>(act_hi + at) = hi;
            if (act_lo != nullptr) {
              *reinterpret_cast<__nv_bfloat162*>(act_lo + at) =
                  __floats2bfloat162_rn(a0 - __low2float(hi), a1 - __high2float(hi));
            }
          }
        }
      }
    }
  }
  // No block leaves while its peer may still multicast into it or arrive on its barriers.
  if constexpr (kCluster > 1) cluster_sync();
}

// Row r of the block list: the hi / lo split of its token's activations (pair sorted[r], token
// pair / top_k), zeros for padding; a warp per row.
__global__ void moe_gather_split_kernel(MoeGatherParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  pdl_wait();
  pdl_trigger();
  if (r >= static_cast<int64_t>(*p.num_blocks) * p.block_m) return;
  const int pair = p.sorted[r];
  const float* x = pair >= 0 ? p.x + static_cast<int64_t>(pair / p.top_k) * p.h : nullptr;
  auto* hi = static_cast<__nv_bfloat16*>(p.hi) + r * p.h;
  auto* lo = static_cast<__nv_bfloat16*>(p.lo) + r * p.h;
  for (int c = lane * 4; c < p.h; c += 128) {
    const float4 v = x != nullptr ? *reinterpret_cast<const float4*>(x + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
    const __nv_bfloat162 l01 = __floats2bfloat162_rn(v.x - __low2float(h01), v.y - __high2float(h01));
    const __nv_bfloat162 l23 = __floats2bfloat162_rn(v.z - __low2float(h23), v.w - __high2float(h23));
    *reinterpret_cast<uint2*>(hi + c) = make_uint2(*reinterpret_cast<const uint32_t*>(&h01),
                                                   *reinterpret_cast<const uint32_t*>(&h23));
    *reinterpret_cast<uint2*>(lo + c) = make_uint2(*reinterpret_cast<const uint32_t*>(&l01),
                                                   *reinterpret_cast<const uint32_t*>(&l23));
  }
}

template <bool kLo, int kCluster, bool kFp8>
void launch(const MoeGemmParams& p, cudaStream_t s) {
  const uint64_t dims[3] = {static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.experts)};
  const uint64_t strides[2] = {static_cast<uint64_t>(p.k) * 2, static_cast<uint64_t>(p.n) * p.k * 2};
  const uint32_t box[3] = {kBk, kBn, 1};
  const CUtensorMap w_map =
      kFp8 ? CUtensorMap{} : swizzled_tensor_map(p.w, true, 3, dims, strides, box, "the experts' weights");
  // Each block of a cluster loads kBm / kCluster rows of a tile.
  auto a_map = [&](const void* base, const char* what) {
    const uint64_t a_dims[2] = {static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.a_rows)};
    const uint64_t a_strides[1] = {static_cast<uint64_t>(p.k) * 2};
    const uint32_t a_box[2] = {kBk, kBm / kCluster};
    return swizzled_tensor_map(base, true, 2, a_dims, a_strides, a_box, what);
  };
  const CUtensorMap hi_map = a_map(p.a_hi, "the rows' hi terms");
  const CUtensorMap lo_map = kLo ? a_map(p.a_lo, "the rows' lo terms") : hi_map;
  auto* kernel = moe_gemm_wgmma_kernel<kLo, kCluster, kFp8>;
  raise_dynamic_smem(kernel, kSmemBytes);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>((p.n + kBn - 1) / kBn), static_cast<unsigned>(p.max_blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = s;
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = kCluster;
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = 1;
  config.attrs = attrs;
  config.numAttrs = kCluster > 1 ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, w_map, hi_map, lo_map));
}

template <bool kLo, bool kFp8>
void launch_paired(const MoeGemmParams& p, cudaStream_t s) {
  const int n_tiles = (p.n + kBn - 1) / kBn;
  if (n_tiles % 2 == 0 && p.cluster) return launch<kLo, 2, kFp8>(p, s);
  launch<kLo, 1, kFp8>(p, s);
}

}  // namespace

void moe_gemm_wgmma(const MoeGemmParams& p, cudaStream_t s) {
  SPECULA_CHECK(p.experts > 0 && !p.gather && p.a_rows > 0 && p.n > 0 && p.k > 0 && p.k % 8 == 0 &&
                    (!p.gate_up || p.n % 64 == 0),
                "moe_gemm_wgmma: weights of {} experts [n {}, k {}] (k a positive multiple of 8; gate|up {}: n a "
                "multiple of 64) over {} rows in block-list order (gather {})",
                p.experts, p.n, p.k, p.gate_up, p.a_rows, p.gather);
  SPECULA_CHECK(p.w_scale == nullptr || (p.k % 16 == 0 && p.scale_k > 0 && p.scale_k % 16 == 0),
                "moe_gemm_wgmma: fp8 weights need k ({}) and the scale run ({}) in multiples of 16", p.k, p.scale_k);
  SPECULA_CHECK(p.max_blocks > 0 && p.max_blocks <= 65535, "moe_gemm_wgmma: {} row blocks (1 to 65535)",
                p.max_blocks);
  const bool fp8 = p.w_scale != nullptr;
  if (p.a_lo != nullptr) {
    fp8 ? launch_paired<true, true>(p, s) : launch_paired<true, false>(p, s);
  } else {
    fp8 ? launch_paired<false, true>(p, s) : launch_paired<false, false>(p, s);
  }
  CUDA_CHECK(cudaGetLastError());
}

void moe_gather_split(const MoeGatherParams& p, cudaStream_t s) {
  SPECULA_CHECK(p.h % 4 == 0, "moe_gather_split: rows of {} values (a multiple of 4)", p.h);
  if (p.max_rows == 0) return;
  constexpr int kRowsPerBlock = 8;
  const int64_t blocks = (p.max_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  launch_pdl(moe_gather_split_kernel, dim3(static_cast<unsigned>(blocks)), dim3(32 * kRowsPerBlock), 0, s, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
