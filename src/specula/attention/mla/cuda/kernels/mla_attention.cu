// Absorbed MLA attention kernels (see mla_attention.h) on Hopper's warpgroup MMA. One block of
// 384 threads per work item (64 query rows, a range of keys), three warpgroups:
// - the producer gathers each 64-key tile (64 latent rows of 576 values) into one of two stages of
//   nine 128-byte-swizzled bf16 column blocks and publishes which keys exist; the slots of a tile's
//   rows are loaded a tile ahead. bf16 rows go there with cp.async (whole pages of a page-64 cache
//   by TMA); fp8_ds_mla rows land raw (each 64-value group in half of its own 128-byte destination
//   row) and are dequantised in place, half by the producer and half by warpgroup 1, with the next
//   tile's copies already in flight (mla_producers.cuh; the layout is in mla_stages.cuh);
// - warpgroup 0 computes S = Q K^T (m64n64, Q and K from shared memory), masks, runs the online
//   softmax, writes P into the stage's RoPE block (dead once S is done) with the rescale factor
//   of every row, and accumulates O[:, 0:256] += P V[:, 0:256] with P from its registers;
// - warpgroup 1 accumulates O[:, 256:512] += P V[:, 256:512] with P from shared memory.
// A last tile of at most 16 keys takes m64n16 scores and one k16 step of each P V half (peeled from
// the tile loop: a branch per tile cost the steady state more than the narrow tile saves).
// A thread holds 128 f32 accumulators of O (m64n256).
// num_splits > 1 writes f32 partials that the combine kernel merges; unsplit, a whole block of 64
// output rows is staged in Q's shared memory and stored by TMA (mla_rows.cuh).
//
// Sparse fp8 steps with a multiple of 128 heads run as clusters of two blocks, the two head blocks
// of one token, which read the same keys (FlashMLA's "crossover"): the producer and warpgroup 1
// of each block load the fp8 values of the block's half of a tile's rows into registers a tile
// ahead, and once the stage is free in both blocks dequantise them into their own stage and
// bulk-copy the result into the peer's. Each block converts half as many values, and neither the
// loads' latency nor a staging round trip sits between a stage coming free and its refill. Dense
// fp8 steps with a multiple of 128 heads pair the two head blocks of a token (and split) the same
// way. (Dense bf16 pages multicast by TMA into such pairs measured no faster: 528-535 / 553-559
// TFLOP/s against 530-539 / 558-565 unpaired on the H200, so the L2's traffic does not limit them.)
#include "specula/attention/mla/cuda/kernels/mla_attention.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <type_traits>

#include "specula/attention/cuda/kernels/cluster.cuh"
#include "specula/core/convert.cuh"
#include "specula/attention/cuda/kernels/tensor_map.h"
#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/attention/mla/cuda/kernels/mla_items.cuh"
#include "specula/attention/mla/cuda/kernels/mla_producers.cuh"
#include "specula/attention/mla/cuda/kernels/mla_rows.cuh"
#include "specula/attention/mla/cuda/kernels/mla_stages.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"

namespace specula::cuda_kernels {

namespace {

using bf16 = __nv_bfloat16;
using namespace mla;

// fp8 kernels: a row's running maximum moves only when a tile's exceeds it by more than this (log2
// units), so P stays below 2^8 (exact enough in bf16, whose precision is relative) and nearly every
// tile's rescale factor is exactly 1, which rescale_rows then skips. Measured on the H200 (TFLOP/s,
// lazy against eager): sparse fp8 376.6 / 367.9, dense fp8 343.3 / 336.2. The bf16 kernel stays
// eager: with the skip it is slower (rescale_rows), and without it lazy changes nothing measurable.
constexpr float kLazyRescale = 8.0f;

// O's two rows of this thread times their rescale factors. Once a row's maximum has settled its
// factor is exactly 1 (exp2 of 0); with kSkipOnes a warp whose 16 rows all have 1 skips the 128
// multiplies (the same bits: x * 1 = x). Measured on the H200 (TFLOP/s, the skip against none):
// fp8 dense 339 / 330, sparse 322 / 314; bf16 dense 462 / 520, sparse 440 / 499, so only the fp8
// kernel skips (with lazy rescaling, kLazyRescale, the bf16 skip still cost dense 490 / 530 and
// sparse 452 / 496).
template <bool kSkipOnes>
__device__ __forceinline__ void rescale_rows(float (&o)[32][4], float a0, float a1) {
  if (kSkipOnes && __all_sync(0xffffffffu, a0 == 1.0f && a1 == 1.0f)) return;
#pragma unroll
  for (int n = 0; n < 32; ++n) {
    o[n][0] *= a0;
    o[n][1] *= a0;
    o[n][2] *= a1;
    o[n][3] *= a1;
  }
}

// A last tile of at most this many keys (a decode step's new key past a whole page, a verify step's
// draft tokens) runs as m64n16 scores and one k16 step of each P V half: at 128 heads and 4097 keys
// that tile costs each block a whole 64-key tile otherwise.
constexpr int kNarrowKeys = 16;

// Runs tile(i, width) over the item's tiles, width a std::integral_constant of the keys the tile's
// products cover: whole 64-key tiles, then a narrow last one. Both warpgroups go through here, so
// they agree on it. Never narrow in paired blocks, where the second copy of warpgroup 1's tile
// made ptxas spill 176 bytes. The condition is made provably warp-uniform (a __shfl_sync), since
// ptxas serialises every wgmma of a kernel that has one in code it cannot prove uniform.
template <bool kPair, typename Tile>
__device__ __forceinline__ void for_each_tile(const mla::Item& it, int num_tiles, Tile&& tile) {
  const int last = it.key_end - it.key_begin - (num_tiles - 1) * kKeys;
  const bool narrow =
      !kPair && __shfl_sync(0xffffffffu, num_tiles > 0 && last <= kNarrowKeys ? 1 : 0, 0) != 0;
  for (int i = 0; i < num_tiles - (narrow ? 1 : 0); ++i) tile(i, std::integral_constant<int, kKeys>{});
  if (narrow) tile(num_tiles - 1, std::integral_constant<int, kNarrowKeys>{});
}

// Warpgroup 0: scores, softmax, P for both halves, O[:, 0:256].
template <bool kFp8, bool kPair>
__device__ void consume_left(const MlaAttentionParams& p, const mla::Item& it, int num_tiles, uint8_t* smem,
                             float (&o)[32][4], float (&m)[2], float (&l)[2]) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  const auto* valid = reinterpret_cast<const uint64_t*>(smem + Layout::valid);
  auto* alpha_out = reinterpret_cast<float*>(smem + Layout::alpha);
  const int warp = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  const int t = lane & 3;
  const int row_base = warp * 16 + (lane >> 2);
  const RowRules rules = row_rules(p, it, row_base);
  const uint64_t q_desc = wgmma_desc(smem_address(smem + Layout::q), 0);
  // Tile i with its first kN keys (kN = 64, or 16 for a last tile of at most 16 keys).
  auto tile = [&](int i, auto width) {
    constexpr int kN = decltype(width)::value;
    constexpr int kJ = kN / 8;   // score column groups a thread holds
    constexpr int kK = kN / 16;  // k16 steps of P V
    float s[kJ][4];
    uint32_t pf[kK][4];
    const int st = i & 1;
    mbarrier_wait(&full[st], (i >> 1) & 1);
    fence_proxy_async();
    const uint32_t k_addr = smem_address(smem + Layout::stage(st));
    const uint64_t k_desc = wgmma_desc(k_addr, 0);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBlocks * 4; ++ks) {
      const uint32_t off = (ks / 4) * kBlockBytes + (ks % 4) * 32;
      wgmma_ss<kN, bf16>(s, wgmma_desc_advance(q_desc, off), wgmma_desc_advance(k_desc, off), ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);

    mask_scores(s, valid[st], rules, it.key_begin + i * kKeys);
    float alpha[2];
    // Both rows' maxima before either row's exponentials, so the second row's shuffles do not wait
    // behind the first row's.
    float mx[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float part[kJ];
#pragma unroll
      for (int j = 0; j < kJ; ++j) part[j] = fmaxf(s[j][2 * r], s[j][2 * r + 1]);
      mx[r] = tree_reduce(part, MaxOp{});
    }
#pragma unroll
    for (int lanes = 1; lanes <= 2; lanes *= 2) {
#pragma unroll
      for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], lanes));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float part[kJ];
      const float m_tile = mx[r] * p.scale_log2;
      const float m_new = m_tile > m[r] + (kFp8 ? kLazyRescale : 0.0f) ? m_tile : m[r];
      // A row that has seen no key keeps -inf; subtracting 0 instead avoids inf - inf.
      const float base = m_new == kNegInf ? 0.0f : m_new;
      alpha[r] = exp2_ftz(m[r] - base);
      m[r] = m_new;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        s[j][2 * r] = exp2_ftz(fmaf(s[j][2 * r], p.scale_log2, -base));
        s[j][2 * r + 1] = exp2_ftz(fmaf(s[j][2 * r + 1], p.scale_log2, -base));
        part[j] = s[j][2 * r] + s[j][2 * r + 1];
      }
      l[r] = l[r] * alpha[r] + tree_reduce(part, AddOp{});
    }
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      pf[kk][0] = pack2<bf16>(s[2 * kk][0], s[2 * kk][1]);
      pf[kk][1] = pack2<bf16>(s[2 * kk][2], s[2 * kk][3]);
      pf[kk][2] = pack2<bf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[kk][3] = pack2<bf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    // P (bf16, as this warpgroup multiplies it) into the stage's RoPE block, for warpgroup 1: each
    // k16 step's fragment is four 8 x 8 matrices (rows +0 / +8, columns +0 / +8), lane 8 j + r
    // addressing row r of matrix j.
    uint8_t* p_block = smem + Layout::stage(st) + kRopeBlock * kBlockBytes;
    const int p_row = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      stmatrix_x4(pf[kk], p_block + swizzled_offset(kRows, p_row, 16 * kk + (lane >> 4) * 8));
    }
    if (t == 0) {
      alpha_out[st * kRows + row_base] = alpha[0];
      alpha_out[st * kRows + row_base + 8] = alpha[1];
    }
    fence_proxy_async();
    named_barrier_arrive(kBarP + st, kConsumerThreads);
    rescale_rows<kFp8>(o, alpha[0], alpha[1]);
    const uint64_t v_desc = wgmma_desc(k_addr, kBlockBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) wgmma_rs_mn<256, bf16>(o, pf[kk], wgmma_desc_advance(v_desc, kk * 16 * 128));
    wgmma_commit();
    // Waiting here rather than behind the next S hands the stage back a whole S earlier; the
    // tensor cores meanwhile run warpgroup 1's half. (Issuing the next S first and waiting for
    // this P V only, with wait_group 1, measured 430 against 561 TFLOP/s on dense q_len 1, H200.)
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pf);
    __syncwarp();  // every lane's P stores precede the release
    if (lane == 0) arrive_here_and_peer<kPair>(&empty[st]);
  };
  for_each_tile<kPair>(it, num_tiles, tile);
}

// Warpgroup 1: O[:, 256:512] with P and the rescale factors from warpgroup 0 (and, for fp8 rows,
// half of each tile's dequantisation first; paired, all of this block's rows of the tile after next,
// once tile i's stage is free in both blocks).
template <bool kFp8, bool kPair>
__device__ void consume_right(const MlaAttentionParams& p, const mla::Item& it, int num_tiles, uint8_t* smem,
                              float (&o)[32][4]) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  const auto* alpha_in = reinterpret_cast<const float*>(smem + Layout::alpha);
  const int warp = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  const int row_base = warp * 16 + (lane >> 2);
  // Paired: this thread's share (blocks 4-7) of the tile after next, loaded a tile ahead.
  const int rank = kPair ? static_cast<int>(cluster_rank()) : 0;
  const int row = pair_row(rank);
  auto own_slot = [&](int tile) { return mla::fetch_slot(p, it, it.key_begin + tile * kKeys + row); };
  PairShare share;
  mla::SlotRef next_own{-1, 0};  // the next share's slot, fetched a tile before its loads
  auto pair_convert = [&](int tile) {  // the share of `tile` into its stage, then load the next
    const int s = tile & 1;
    uint8_t* stage = smem + Layout::stage(s);
    pair_store<1>(share, row, stage);
    fence_proxy_async();
    if ((threadIdx.x & 127) == 0) {
      mbarrier_arrive_expect_tx(&full[s], kPairTxBytes);
    } else {
      mbarrier_arrive(&full[s]);
    }
    pair_send<1>(row, stage, &full[s]);
    if (tile + 1 < num_tiles) {
      pair_load<1>(p, mla::resolve_slot(p, next_own), share);
      next_own = own_slot(tile + 2);
    }
  };
  if constexpr (kPair) {
    if (num_tiles > 0) pair_load<1>(p, mla::resolve_slot(p, own_slot(0)), share);
    next_own = own_slot(1);
    for (int t = 0; t < 2 && t < num_tiles; ++t) pair_convert(t);  // both stages start free
  }
  // Tile i's P V with its first kN keys (as warpgroup 0's tile).
  auto tile = [&](int i, auto width) {
    constexpr int kK = decltype(width)::value / 16;
    const int st = i & 1;
    if constexpr (kFp8 && !kPair) {
      mbarrier_wait(reinterpret_cast<uint64_t*>(smem + Layout::landed) + st, (i >> 1) & 1);
      const auto* scales = reinterpret_cast<const float*>(smem + Layout::scales) + st * kRows * 4;
      dequantise_fp8_blocks(warp, kFp8ProducerBlocks, kHalfBlocks * 2, smem + Layout::stage(st), scales);
      fence_proxy_async();
      mbarrier_arrive(&full[st]);
    }
    mbarrier_wait(&full[st], (i >> 1) & 1);
    named_barrier_sync(kBarP + st, kConsumerThreads);
    fence_proxy_async();
    rescale_rows<kFp8>(o, alpha_in[st * kRows + row_base], alpha_in[st * kRows + row_base + 8]);
    const uint32_t k_addr = smem_address(smem + Layout::stage(st));
    const uint64_t p_desc = wgmma_desc(k_addr + kRopeBlock * kBlockBytes, 0);
    const uint64_t v_desc = wgmma_desc(k_addr + kHalfBlocks * kBlockBytes, kBlockBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      wgmma_ss_mn<256, bf16>(o, wgmma_desc_advance(p_desc, kk * 32), wgmma_desc_advance(v_desc, kk * 16 * 128));
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
    __syncwarp();  // every lane's reads of the stage's rescale factors precede the release
    if (lane == 0) arrive_here_and_peer<kPair>(&empty[st]);
    if constexpr (kPair) {
      if (i + 2 < num_tiles) {
        mbarrier_wait(&empty[st], (i >> 1) & 1);
        pair_convert(i + 2);
      }
    }
  };
  for_each_tile<kPair>(it, num_tiles, tile);
}

// kPair: fp8 steps as clusters of two blocks (see the top of the file).
template <bool kFp8, bool kPair>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_kernel(const MlaAttentionParams p,
                                                                     const __grid_constant__ CUtensorMap cache_map,
                                                                     const __grid_constant__ CUtensorMap out_map) {
  static_assert(kFp8 || !kPair, "only fp8 rows are shared between paired blocks");
  if (p.slots == nullptr && static_cast<int>(blockIdx.x) >= *p.num_items) return;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_address(smem_raw) & 1023u)) & 1023u);
  const mla::Item it = mla::decode_item(p, mla::item_of(p, kPair));
  const int num_tiles = it.key_end > it.key_begin ? (it.key_end - it.key_begin + kKeys - 1) / kKeys : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      // Full: every producer thread (bf16: its copies, plus one arrival per warp for the bits;
      // fp8: after its conversions; paired: both), and with fp8 every thread of warpgroup 1 after
      // its conversions (paired, one of them also expects the peer's rows as transaction bytes).
      mbarrier_init(reinterpret_cast<uint64_t*>(smem + Layout::full) + s,
                    kPair ? 2 * kProducerThreads + 128 : kProducerThreads + (kFp8 ? 128 : 4));
      mbarrier_init(reinterpret_cast<uint64_t*>(smem + Layout::landed) + s, kProducerThreads);
      // Empty: one arrival per consumer warp, of both blocks when paired.
      mbarrier_init(reinterpret_cast<uint64_t*>(smem + Layout::empty) + s, kPair ? 16 : 8);
    }
  }
  // The initialisations become visible to the async proxy (TMA and bulk copies complete on these
  // barriers) and, paired, to the peer, which arrives on them and writes into the stages: neither
  // block starts before both have initialised them, and neither exits while the other may still
  // reach into it.
  if (threadIdx.x == 0) fence_mbarrier_init_cluster();
  if constexpr (kPair) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  if (threadIdx.x >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    if constexpr (kPair) {
      pdl_wait();
      pdl_trigger();
      produce_pair(p, it, num_tiles, smem);
      cluster_sync();
    } else if constexpr (kFp8) {
      pdl_wait();
      pdl_trigger();
      produce_fp8(p, it, num_tiles, smem);
    } else {
      produce_bf16(p, tma_pages(p) ? &cache_map : nullptr, it, num_tiles, smem);
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegisters>();
  const int wg = threadIdx.x >> 7;
  const int lane = threadIdx.x & 31;
  const int t = lane & 3;
  const int row_base = ((threadIdx.x >> 5) & 3) * 16 + (lane >> 2);

  // Everything before this point reads step metadata only; Q is the previous kernels' output.
  pdl_wait();
  pdl_trigger();
  load_q(p, it, smem + Layout::q, kConsumerThreads);
  named_barrier_sync(kBarQ, kConsumerThreads);

  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.0f, 0.0f};
  auto* stats = reinterpret_cast<float*>(smem + Layout::stats);
  if (wg == 0) {
    consume_left<kFp8, kPair>(p, it, num_tiles, smem, o, m, l);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      if (t == 0) {
        stats[row_base + 8 * r] = l[r];
        stats[kRows + row_base + 8 * r] = m[r];
      }
    }
  } else {
    consume_right<kFp8, kPair>(p, it, num_tiles, smem, o);
  }
  // Warpgroup 0's statistics are in shared memory for warpgroup 1; unpaired, warpgroup 0 writes
  // its half of O without waiting for warpgroup 1's last products.
  if (wg == 0 && !kPair) {
    named_barrier_arrive(kBarEnd, kConsumerThreads);
  } else {
    named_barrier_sync(kBarEnd, kConsumerThreads);
  }
  if constexpr (kPair) cluster_sync();
  if (wg == 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = stats[row_base + 8 * r];
      m[r] = stats[kRows + row_base + 8 * r];
    }
  }

  write_rows(p, it, wg, row_base, o, l, m, tma_output(p) ? &out_map : nullptr, smem + Layout::q);
}

// One block per query row: merges its splits (log2-domain LSEs), folds in the sink, writes bf16.
__global__ void __launch_bounds__(128) mla_combine_kernel(const MlaAttentionParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  float m = kNegInf;
  for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, p.part_lse[s * rows + row]);
  float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float total = 0.0f;
  if (m != kNegInf) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = exp2f(p.part_lse[s * rows + row] - m);
      if (w == 0.0f) continue;  // an empty split's values are never read
      total += w;
      const float4 v = *reinterpret_cast<const float4*>(p.part_o + (s * rows + row) * kMlaLoraRank + threadIdx.x * 4);
      o[0] += w * v.x;
      o[1] += w * v.y;
      o[2] += w * v.z;
      o[3] += w * v.w;
    }
  }
  float lse = total > 0.0f ? (m + log2f(total)) * 0.6931471805599453f : kNegInf;
  float inv = total > 0.0f ? 1.0f / total : 0.0f;
  fold_sink(p, row, lse, inv);
  auto* out = static_cast<__nv_bfloat16*>(p.out) + row * kMlaLoraRank + threadIdx.x * 4;
  *reinterpret_cast<uint32_t*>(out) = pack2<__nv_bfloat16>(o[0] * inv, o[1] * inv);
  *reinterpret_cast<uint32_t*>(out + 2) = pack2<__nv_bfloat16>(o[2] * inv, o[3] * inv);
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[row] = lse;
}

// The cache as a [num_slots, 576] bf16 tensor map with 64 x 64 boxes and the 128-byte swizzle.
CUtensorMap cache_tensor_map(const MlaAttentionParams& p) {
  const uint64_t dims[2] = {static_cast<uint64_t>(kBlocks * 64), static_cast<uint64_t>(p.num_slots)};
  const uint64_t strides[1] = {static_cast<uint64_t>(p.row_bytes)};
  const uint32_t box[2] = {64, 64};
  return swizzled_tensor_map(p.cache, true, 2, dims, strides, box, "the MLA cache");
}

// The output as [num_tokens * num_q_heads, 512] bf16 with 64 x 64 boxes and the 128-byte swizzle.
CUtensorMap out_tensor_map(const MlaAttentionParams& p) {
  const uint64_t dims[2] = {kMlaLoraRank, static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.num_q_heads)};
  const uint64_t strides[1] = {kMlaLoraRank * 2};
  const uint32_t box[2] = {64, kRows};
  return swizzled_tensor_map(p.out, true, 2, dims, strides, box, "the MLA output");
}

}  // namespace

void launch_mla_attention(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.max_items == 0) return;
  // fp8 steps as clusters of two blocks (see the top of the file); dense items are planned in
  // pairs for them (mla_head_blocks_pair).
  const bool paired = params.fp8 != 0 && mla_head_blocks_pair(params.num_q_heads);
  const auto kernel = paired            ? mla_attention_kernel<true, true>
                      : params.fp8 != 0 ? mla_attention_kernel<true, false>
                                        : mla_attention_kernel<false, false>;
  raise_dynamic_smem(kernel, Layout::bytes);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(params.max_items));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Layout::bytes;
  config.stream = stream;
  // Programmatic dependent launch: the block's set-up and its first dense tiles overlap the kernel
  // before it (see pdl_wait's places in the kernel).
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = 2;
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = 1;
  config.attrs = attrs;
  config.numAttrs = paired ? 2 : 1;
  const CUtensorMap map = tma_pages(params) ? cache_tensor_map(params) : CUtensorMap{};
  const CUtensorMap out_map = tma_output(params) ? out_tensor_map(params) : CUtensorMap{};
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params, map, out_map));
}

void launch_mla_combine(const MlaAttentionParams& params, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_q_heads;
  if (rows == 0 || params.num_splits <= 1) return;
  launch_pdl(mla_combine_kernel, dim3(static_cast<unsigned>(rows)), dim3(kMlaLoraRank / 4), 0, stream, params);
}

}  // namespace specula::cuda_kernels
