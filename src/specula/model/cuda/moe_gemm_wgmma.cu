// moe_gemm_wgmma (moe_kernels.h): moe_gemm's large tile on Hopper's warpgroup MMA, for bf16
// expert weights. This is the prefill case: hundreds of rows per expert, so the products are
// compute-bound, and mma.sync (moe_gemm.cu) reached 0.39 of cuBLAS's tensor-core rate there.
//
// A block owns 128 rows of one expert (moe_align's large blocks) and 256 output columns:
// - a producer warpgroup fills a ring of three stages of 128-byte-swizzled tiles (wgmma.cuh): the
//   expert's k tile of weights [256 x 64] by TMA from one thread (a 3-D map over [experts, n, k],
//   so a tile never reads into the next expert and columns past n land as zeros), and the rows'
//   hi and lo tiles [128 x 64] by cp.async (gate|up gathers each row from its token). A stage's
//   `full` barrier counts the TMA bytes and one cp.async arrival per producer thread; its `empty`
//   barrier one arrival per consumer warp.
// - two consumer warpgroups of 64 rows each hold their 64 x 256 f32 accumulators in registers;
//   per k tile they issue 4 k16 steps of m64n256k16 products over the hi and the lo term (the
//   same weights for both) and keep one tile's batch in flight, releasing a stage once the batch
//   after it has been issued, so that the tensor cores do not wait on the ring.
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
#include "specula/model/cuda/moe_kernels.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kBm = 128, kBn = 256, kBk = 64, kStages = 3;
constexpr int kConsumerThreads = 256, kProducerThreads = 128, kThreads = kConsumerThreads + kProducerThreads;
static_assert(kProducerThreads == kBm, "one producer thread per row (its source index)");
// The producer needs few registers; each consumer thread holds 128 accumulators.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
static_assert(kProducerThreads * kProducerRegisters + kConsumerThreads * kConsumerRegisters <= 65536);
constexpr int kATileBytes = kBm * kBk * 2;
constexpr int kBTileBytes = kBn * kBk * 2;
constexpr int kStageBytes = 2 * kATileBytes + kBTileBytes;
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes + 1024;  // + the ring's alignment

// kLo: the activations are the hi and lo bf16 terms of f32 rows (specula's f32-accurate
// products); otherwise hi alone (bf16 activations, as peers run them; bench moe times it).
template <bool kLo>
__global__ void __launch_bounds__(kThreads, 1)
    moe_gemm_wgmma_kernel(const MoeGemmParams p, const __grid_constant__ CUtensorMap w_map) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  __shared__ int row_src[kBm];
  const int block = blockIdx.y;
  if (block >= *p.num_blocks) {
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
  if (tid < kBm) {
    const int64_t r = static_cast<int64_t>(block) * kBm + tid;
    const int pair = p.sorted[r];
    row_src[tid] = pair < 0 ? -1 : (p.gather ? pair / p.top_k : static_cast<int>(r));
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], kProducerThreads + 1);  // each producer thread's copies, and the TMA
      mbarrier_init(&empty[s], kConsumerThreads / 32);
    }
    fence_mbarrier_init_cluster();
  }
  __syncthreads();

  if (tid >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    const int pt = tid - kConsumerThreads, lane = pt & 31, warp = pt >> 5;
    auto load_b = [&](int kt) {
      const int s = kt % kStages;
      mbarrier_arrive_expect_tx(&full[s], kBTileBytes);
      tma_load_3d(b_tile(s), &w_map, kt * kBk, n0, expert, &full[s]);
    };
    // The weights do not depend on the previous kernel: the first stages' go out before the wait.
    if (pt == 0) {
      for (int kt = 0; kt < k_tiles && kt < kStages; ++kt) load_b(kt);
    }
    pdl_wait();
    pdl_trigger();
    const auto* a_hi = static_cast<const __nv_bfloat16*>(p.a_hi);
    const auto* a_lo = static_cast<const __nv_bfloat16*>(p.a_lo);
    const int chunk = lane % 8;  // each warp instruction: 4 rows of 8 chunks (128 contiguous bytes each)
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % kStages;
      if (kt >= kStages) {
        mbarrier_wait(&empty[s], ((kt / kStages) - 1) & 1);
        if (pt == 0) load_b(kt);
      }
      const int kk = kt * kBk + chunk * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = warp * 32 + i * 4 + lane / 8;
        const int src = row_src[r];
        const bool valid = src >= 0 && kk < p.k;
        const int64_t off = valid ? static_cast<int64_t>(src) * p.k + kk : 0;
        const int dst = swizzled_offset(kBm, r, chunk * 8);
        cp_async_16(a_hi_tile(s) + dst, a_hi + off, valid);
        if constexpr (kLo) cp_async_16(a_lo_tile(s) + dst, a_lo + off, valid);
      }
      mbarrier_arrive_cp_async(&full[s]);
    }
    cp_async_wait<0>();
    return;
  }

  setmaxnreg_inc<kConsumerRegisters>();
  pdl_trigger();
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid & 31;
  float acc[kBn / 8][4];
#pragma unroll
  for (int j = 0; j < kBn / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    mbarrier_wait(&full[s], (kt / kStages) & 1);
    fence_proxy_async();  // the cp.async rows, written by the generic proxy, before wgmma reads them
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
    if (kt > 0 && lane == 0) mbarrier_arrive(&empty[(kt - 1) % kStages]);
  }
  wgmma_wait<0>();
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
    return;
  }
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

template <bool kLo>
void launch(const MoeGemmParams& p, cudaStream_t s) {
  const uint64_t dims[3] = {static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.experts)};
  const uint64_t strides[2] = {static_cast<uint64_t>(p.k) * 2, static_cast<uint64_t>(p.n) * p.k * 2};
  const uint32_t box[3] = {kBk, kBn, 1};
  const CUtensorMap map = swizzled_tensor_map(p.w, true, 3, dims, strides, box, "the experts' weights");
  raise_dynamic_smem(moe_gemm_wgmma_kernel<kLo>, kSmemBytes);
  const dim3 grid(static_cast<unsigned>((p.n + kBn - 1) / kBn), static_cast<unsigned>(p.max_blocks));
  launch_pdl(moe_gemm_wgmma_kernel<kLo>, grid, kThreads, kSmemBytes, s, p, map);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void moe_gemm_wgmma(const MoeGemmParams& p, cudaStream_t s) {
  SPECULA_CHECK(p.experts > 0 && p.w_scale == nullptr && p.k % 8 == 0 && (!p.gate_up || p.n % 64 == 0),
                "moe_gemm_wgmma: bf16 weights of {} experts [{}, {}] (k a multiple of 8, gate|up rows of 64)",
                p.experts, p.n, p.k);
  SPECULA_CHECK(p.max_blocks <= 65535, "moe_gemm: {} row blocks (at most 65535)", p.max_blocks);
  if (p.a_lo != nullptr) return launch<true>(p, s);
  launch<false>(p, s);
}

}  // namespace specula::cuda_kernels
