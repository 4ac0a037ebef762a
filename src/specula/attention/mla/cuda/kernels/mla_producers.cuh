// The MLA attention kernel's producers (mla_attention.cu): each fills the two stages of 64-key
// tiles for the consumer warpgroups. bf16 rows: cp.async gathers, or whole pages by TMA; fp8_ds_mla
// rows: raw staging and in-place dequantisation shared with warpgroup 1; paired sparse fp8 blocks
// (clusters of two): register-staged shares converted into both blocks' stages.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "specula/attention/cuda/kernels/cluster.cuh"
#include "specula/core/convert.cuh"
#include "specula/attention/cuda/kernels/tma.cuh"
#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/attention/mla/cuda/kernels/mla_stages.cuh"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels::mla {

// Dense steps over a page-64 bf16 cache load whole pages by TMA (`map` over the cache as
// [num_slots, 576] bf16, 64 x 64 boxes, 128-byte swizzle: the stages' layout). Tiles must start on
// page boundaries (split boundaries are multiples of 64 keys) and slots fit the copy's int row.
__host__ __device__ __forceinline__ bool tma_pages(const MlaAttentionParams& p) {
  return p.slots == nullptr && p.fp8 == 0 && p.page_size == kKeys && p.split_align % kKeys == 0 &&
         p.num_slots > 0 && p.num_slots <= INT32_MAX;
}

// bf16 rows: producer warp w gathers rows 16 w .. 16 w + 15 of every tile with cp.async; lane =
// 8 * (row % 4) + chunk, so eight lanes read 128 contiguous bytes of a row per column block. With
// tma_pages, a tile whose 64 keys all exist is one whole page (tiles start on page boundaries), so
// one thread issues its nine column blocks as tensor copies from the slot of its row 0; a partial
// last tile keeps cp.async, whose missing rows land as zeros.
static __device__ void produce_bf16(const MlaAttentionParams& p, const CUtensorMap* map, const mla::Item& it,
                                    int num_tiles, uint8_t* smem) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  auto* valid = reinterpret_cast<uint64_t*>(smem + Layout::valid);
  const int warp = (threadIdx.x - kConsumerThreads) >> 5;
  const int lane = threadIdx.x & 31;
  const int chunk = lane & 7;
  // Dense tiles wholly before the step's new keys (the last q_len of the request) are copied
  // before pdl_wait: the kernel just before this one writes only those keys (and Q), and the page
  // table is step metadata (core/cuda_pdl.cuh). Sparse slots are that kernel's output, so sparse
  // steps wait before their first slot lookup.
  const int old_keys = it.kv_len - it.q_len;
  bool waited = false;
  auto wait_once = [&] {
    if (waited) return;
    pdl_wait();
    pdl_trigger();
    waited = true;
  };
  if (p.slots != nullptr) wait_once();
  int64_t slot = mla::resolve_slot(p, tile_slot(p, it, num_tiles > 0 ? 0 : -1, warp));
  for (int i = 0; i < num_tiles; ++i) {
    const int s = i & 1;
    if (i >= 2) mbarrier_wait(&empty[s], ((i >> 1) - 1) & 1);
    if (it.key_begin + (i + 1) * kKeys > old_keys) wait_once();
    publish_valid(slot, warp, &valid[s]);
    uint8_t* stage = smem + Layout::stage(s);
    if (map != nullptr && it.key_begin + (i + 1) * kKeys <= it.key_end) {
      if (lane == 0) mbarrier_arrive(&full[s]);  // releases the valid bits
      if (threadIdx.x == kConsumerThreads) {
        mbarrier_arrive_expect_tx(&full[s], kTileBytes);
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          tma_load_2d(stage + b * kBlockBytes, map, 64 * b, static_cast<int>(slot), &full[s]);
        }
      } else {
        mbarrier_arrive(&full[s]);
      }
      slot = mla::resolve_slot(p, tile_slot(p, it, i + 1 < num_tiles ? i + 1 : -1, warp));
      continue;
    }
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {
      const int r = pass * 4 + (lane >> 3);
      const int64_t sl = __shfl_sync(0xffffffffu, slot, r);
      const int row = 16 * warp + r;
      const uint8_t* src = p.cache + (sl >= 0 ? sl * p.row_bytes : 0) + chunk * 16;
      const int dst = row * 128 + ((chunk ^ (row & 7)) << 4);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) cp_async_16(stage + b * kBlockBytes + dst, src + b * 128, sl >= 0);
    }
    if (lane == 0) mbarrier_arrive(&full[s]);  // releases the valid bits; the copies arrive below
    mbarrier_arrive_cp_async(&full[s]);
    slot = mla::resolve_slot(p, tile_slot(p, it, i + 1 < num_tiles ? i + 1 : -1, warp));
  }
  wait_once();
  // No drain before exiting: the consumers wait on every tile's full barrier, so the block
  // outlives all copies.
}

// fp8_ds_mla rows: the 64 fp8 values of column block b of row r land in one half of that row's
// 128-byte destination (which they will fill as bf16): bytes 64..127 for even rows, 0..63 for odd
// ones, so that reading eight consecutive rows' values covers all 32 banks. The four group scales
// go into a side array and the bf16 RoPE part straight into block 8.
__device__ __forceinline__ int raw_half(int row) { return (~row & 1) * 64; }

static __device__ void issue_fp8_tile(const MlaAttentionParams& p, int64_t slot, int warp, uint8_t* stage,
                                      float* scales) {
  const int lane = threadIdx.x & 31;
#pragma unroll 4
  for (int r = 0; r < 16; ++r) {  // fp8 values: one row per pass, lane = 16-byte chunk
    const int64_t sl = __shfl_sync(0xffffffffu, slot, r);
    const int row = 16 * warp + r;
    const uint8_t* src = p.cache + (sl >= 0 ? sl * p.row_bytes : 0) + lane * 16;
    cp_async_16(stage + (lane >> 2) * kBlockBytes + row * 128 + raw_half(row) + (lane & 3) * 16, src, sl >= 0);
  }
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {  // RoPE: 8 chunks per row, four rows per pass
    const int r = pass * 4 + (lane >> 3);
    const int chunk = lane & 7;
    const int64_t sl = __shfl_sync(0xffffffffu, slot, r);
    const int row = 16 * warp + r;
    const uint8_t* src = p.cache + (sl >= 0 ? sl * p.row_bytes : 0) + kMlaLoraRank + 16 + chunk * 16;
    cp_async_16(stage + kRopeBlock * kBlockBytes + row * 128 + ((chunk ^ (row & 7)) << 4), src, sl >= 0);
  }
  const int64_t sl = __shfl_sync(0xffffffffu, slot, lane & 15);
  if (lane < 16) {
    cp_async_16(scales + (16 * warp + lane) * 4, p.cache + (sl >= 0 ? sl * p.row_bytes : 0) + kMlaLoraRank, sl >= 0);
  }
  cp_async_commit();
}

// In place: four lanes own one (row, block) pair, 16 of its 64 values each; a warp's eight pairs
// at a time are eight consecutive rows of one block. Each lane reads its 16 raw bytes, then writes
// 32 bytes of bf16; a batch's reads all precede its writes, since a pair's bf16 overwrite its raw
// half. Warp w converts rows 16 w .. 16 w + 15, column blocks [b_begin, b_end).
static __device__ void dequantise_fp8_blocks(int warp, int b_begin, int b_end, uint8_t* stage, const float* scales) {
  const int lane = threadIdx.x & 31;
  const int c = lane & 3;
  constexpr int kBatch = 2;
  for (int q0 = 16 * b_begin; q0 < 16 * b_end; q0 += 8 * kBatch) {  // q = 16 block + row in warp
    uint4 raw[kBatch];
    int offset[kBatch];
    int row[kBatch];
    float scale[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int q = q0 + 8 * u + (lane >> 2);
      const int b = q >> 4;
      row[u] = 16 * warp + (q & 15);
      offset[u] = b * kBlockBytes + row[u] * 128;
      raw[u] = *reinterpret_cast<const uint4*>(stage + offset[u] + raw_half(row[u]) + 16 * c);
      scale[u] = scales[row[u] * 4 + b / 2];
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int swizzle = row[u] & 7;
      *reinterpret_cast<uint4*>(stage + offset[u] + (((2 * c) ^ swizzle) << 4)) =
          fp8x8_scaled_to_bf16(make_uint2(raw[u].x, raw[u].y), scale[u]);
      *reinterpret_cast<uint4*>(stage + offset[u] + (((2 * c + 1) ^ swizzle) << 4)) =
          fp8x8_scaled_to_bf16(make_uint2(raw[u].z, raw[u].w), scale[u]);
    }
  }
}

// True for every lane once the barrier's phase of this parity has completed (each lane acquires
// it itself); the lanes agree, so the warp's choice stays uniform.
__device__ __forceinline__ bool warp_test_wait(uint64_t* bar, uint32_t parity) {
  return __all_sync(0xffffffffu, mbarrier_test_wait(bar, parity));
}

// The producer keeps two tiles in flight: while it waits for tile i to land it issues tile i + 1
// as soon as tile i - 1 is consumed, then converts tile i (blocks [0, kFp8ProducerBlocks);
// warpgroup 1 converts the rest) and arrives on its full barrier.
static __device__ void produce_fp8(const MlaAttentionParams& p, const mla::Item& it, int num_tiles, uint8_t* smem) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  auto* valid = reinterpret_cast<uint64_t*>(smem + Layout::valid);
  auto* scales = reinterpret_cast<float*>(smem + Layout::scales);
  auto* landed = reinterpret_cast<uint64_t*>(smem + Layout::landed);
  const int warp = (threadIdx.x - kConsumerThreads) >> 5;
  int issued = 0;
  int64_t slot = mla::resolve_slot(p, tile_slot(p, it, num_tiles > 0 ? 0 : -1, warp));
  auto issue = [&]() {
    const int s = issued & 1;
    publish_valid(slot, warp, &valid[s]);
    issue_fp8_tile(p, slot, warp, smem + Layout::stage(s), scales + s * kRows * 4);
    mbarrier_arrive_cp_async(&landed[s]);
    ++issued;
    slot = mla::resolve_slot(p, tile_slot(p, it, issued < num_tiles ? issued : -1, warp));
  };
  while (issued < num_tiles && issued < 2) issue();  // both stages start free
  for (int i = 0; i < num_tiles; ++i) {
    const int s = i & 1;
    // Issue tile i (if the last wait did not) and tile i + 1 as their stages free up, until tile i
    // has landed. Tile t's stage is free once tile t - 2 is consumed: phase t / 2 - 1 of its
    // empty barrier.
    for (;;) {
      if (issued <= i + 1 && issued < num_tiles && warp_test_wait(&empty[issued & 1], ((issued >> 1) - 1) & 1)) {
        issue();
      }
      if (issued > i && warp_test_wait(&landed[s], (i >> 1) & 1)) break;
    }
    dequantise_fp8_blocks(warp, 0, kFp8ProducerBlocks, smem + Layout::stage(s), scales + s * kRows * 4);
    fence_proxy_async();
    mbarrier_arrive(&full[s]);
  }
}

// A paired block's thread's share of a tile: four threads per row of the block's 32 (tile rows
// 32 rank + tid / 4), and per thread 16 fp8 values of each of four column blocks (thread c of
// the row holds values 64 b + 16 c .. + 15, so each load instruction reads whole sectors) with
// their two group scales: blocks 0-3 for the producer's threads (kHalf 0), blocks 4-7 for
// warpgroup 1's (kHalf 1). A missing row loads zeros. Loaded a tile ahead into registers, so a
// stage coming free waits only for the conversion.
struct PairShare {
  static constexpr int kBlocksPerThread = kHalfBlocks;
  uint4 raw[kBlocksPerThread];
  float2 scales;
};

__device__ __forceinline__ int pair_row(int rank) { return kPairRows * rank + ((threadIdx.x & 127) >> 2); }

template <int kHalf>
__device__ __forceinline__ void pair_load(const MlaAttentionParams& p, int64_t slot, PairShare& sh) {
  constexpr int kN = PairShare::kBlocksPerThread;
  const int c = threadIdx.x & 3;
  const uint8_t* row = p.cache + (slot >= 0 ? slot : 0) * p.row_bytes;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int b = 0; b < kN; ++b) {
    sh.raw[b] = slot >= 0 ? __ldg(reinterpret_cast<const uint4*>(row + 64 * (kN * kHalf + b) + 16 * c)) : zero;
  }
  const float2 none = make_float2(0.0f, 0.0f);
  sh.scales = slot >= 0 ? __ldg(reinterpret_cast<const float2*>(row + kMlaLoraRank + 8 * kHalf)) : none;
}

// Asks the L2 for the lines of a share (its chunks and its scales) a tile before pair_load.
template <int kHalf>
__device__ __forceinline__ void pair_prefetch(const MlaAttentionParams& p, int64_t slot) {
  if (slot < 0) return;
  constexpr int kN = PairShare::kBlocksPerThread;
  const int c = threadIdx.x & 3;
  const uint8_t* row = p.cache + slot * p.row_bytes;
#pragma unroll
  for (int b = 0; b < kN; ++b) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + 64 * (kN * kHalf + b) + 16 * c));
  if (c == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + kMlaLoraRank + 8 * kHalf));
}

// Dequantises a share into its row of the stage: chunks 2c and 2c + 1 of each of its column blocks.
template <int kHalf>
__device__ __forceinline__ void pair_store(const PairShare& sh, int row, uint8_t* stage) {
  constexpr int kN = PairShare::kBlocksPerThread;
  const int c = threadIdx.x & 3;
  auto offset = [&](int block, int h) { return block * kBlockBytes + row * 128 + (((2 * c + h) ^ (row & 7)) << 4); };
#pragma unroll
  for (int b = 0; b < kN; ++b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 raw = h == 0 ? make_uint2(sh.raw[b].x, sh.raw[b].y) : make_uint2(sh.raw[b].z, sh.raw[b].w);
      *reinterpret_cast<uint4*>(stage + offset(kN * kHalf + b, h)) =
          fp8x8_scaled_to_bf16(raw, b < kN / 2 ? sh.scales.x : sh.scales.y);
    }
  }
}

// Once a warp's 32 threads have stored their 8 rows (of the block's 32) of a tile, each fenced for
// the async proxy, lane b bulk-copies the warp's rows of its column block b (1 KB, contiguous)
// into the peer's stage, counted on the peer's full barrier. Each warp sends as soon as its own
// rows are done: waiting for the whole warpgroup (a named barrier, then one thread copying 4 KB
// per block) measured 414 / 413 TFLOP/s (sparse / dense fp8) against 431 / 440 (H200). Copies
// rather than a 16-byte remote store per chunk: per-chunk st.async (each counted on the peer's
// mbarrier) measured 308 TFLOP/s sparse against 366 for per-warpgroup copies at the time.
template <int kHalf>
__device__ __forceinline__ void pair_send(int row, uint8_t* stage, uint64_t* full) {
  __syncwarp();
  constexpr int kN = PairShare::kBlocksPerThread;
  const int b = threadIdx.x & 31;  // lane b copies column block b's rows of this warp
  if (b >= kN) return;
  const int first = row & ~7;
  const uint32_t peer = static_cast<uint32_t>(row / kPairRows) ^ 1u;
  const uint8_t* rows = stage + (kN * kHalf + b) * kBlockBytes + first * 128;
  bulk_copy_to_peer(cluster_map(rows, peer), rows, 8 * 128, cluster_map(full, peer));
}

// Paired blocks' producer: the existence bits and the bf16 RoPE parts (cp.async) of all 64 rows of
// every tile, and its share (blocks 0-3) of the block's 32 rows. A stage is free once both blocks'
// consumers are done with it, since the peer writes into it too. (Sending the RoPE part through
// the pair as well measured 352 TFLOP/s against 366.) The stage is usually free already when this
// producer gets to it, so the share loads it issues at the end of a tile are waited for at the top
// of the next (ncu: 40% of its stall samples there, the producer setting the pace): the share of
// the tile after next is therefore asked of the L2 a tile before its loads. H200, sparse / dense
// fp8: 415.8 / 415.0 TFLOP/s against 399.5 / 408.9. (Doing the same in warpgroup 1, whose loads
// have a whole tile to land, measured 385 / 387; the RoPE rows as well, or the prefetch two tiles
// ahead with 64 registers here and 216 in warpgroup 1, 396-398.) With the per-warp copies of
// pair_send ptxas spills one register (4 bytes) in this 56-register producer, stored and loaded
// once per block before the tile loop (ncu SASS at 2cb32cb); the 64 / 224 / 216 split that would
// avoid it costs 5%.
static __device__ void produce_pair(const MlaAttentionParams& p, const mla::Item& it, int num_tiles, uint8_t* smem) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  auto* valid = reinterpret_cast<uint64_t*>(smem + Layout::valid);
  const int warp = (threadIdx.x - kConsumerThreads) >> 5;
  const int lane = threadIdx.x & 31;
  const int rank = static_cast<int>(cluster_rank());
  const int row = pair_row(rank);
  // The share's slot is looked up a tile before its loads, so they never wait for it.
  auto own_slot = [&](int tile) { return mla::fetch_slot(p, it, it.key_begin + tile * kKeys + row); };
  PairShare share;
  if (num_tiles > 0) pair_load<0>(p, mla::resolve_slot(p, own_slot(0)), share);
  mla::SlotRef next_own = own_slot(1);
  mla::SlotRef ahead = own_slot(2);
  mla::SlotRef next = tile_slot(p, it, num_tiles > 0 ? 0 : -1, warp);
  for (int i = 0; i < num_tiles; ++i) {
    const int s = i & 1;
    if (i >= 2) mbarrier_wait(&empty[s], ((i >> 1) - 1) & 1);
    const int64_t slot = mla::resolve_slot(p, next);
    publish_valid(slot, warp, &valid[s]);
    uint8_t* stage = smem + Layout::stage(s);
    // The RoPE gather of issue_fp8_tile, written out again on purpose: sharing it as a helper made
    // ptxas spill in this 56-register producer and cost the paired kernel 6% (H200: 354 against 376).
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {  // RoPE: 8 chunks per row, four rows per pass
      const int r = pass * 4 + (lane >> 3);
      const int chunk = lane & 7;
      const int64_t sl = __shfl_sync(0xffffffffu, slot, r);
      const int rope_row = 16 * warp + r;
      const uint8_t* src = p.cache + (sl >= 0 ? sl * p.row_bytes : 0) + kMlaLoraRank + 16 + chunk * 16;
      cp_async_16(stage + kRopeBlock * kBlockBytes + rope_row * 128 + ((chunk ^ (rope_row & 7)) << 4), src, sl >= 0);
    }
    mbarrier_arrive_cp_async(&full[s]);
    pair_store<0>(share, row, stage);
    fence_proxy_async();
    mbarrier_arrive(&full[s]);  // this thread's conversions (and lane 0's existence bits)
    pair_send<0>(row, stage, &full[s]);
    if (i + 1 < num_tiles) {
      pair_load<0>(p, mla::resolve_slot(p, next_own), share);
      pair_prefetch<0>(p, mla::resolve_slot(p, ahead));
      next_own = ahead;
      ahead = own_slot(i + 3);
      next = tile_slot(p, it, i + 1, warp);
    }
  }
}

// Arrives on this block's mbarrier and, paired, on the peer's copy of it.
template <bool kPair>
__device__ __forceinline__ void arrive_here_and_peer(uint64_t* bar) {
  mbarrier_arrive(bar);
  if constexpr (kPair) mbarrier_arrive_cluster(cluster_map(bar, cluster_rank() ^ 1u));
}

}  // namespace specula::cuda_kernels::mla
