// Absorbed MLA attention kernels (see mla_attention.h) on Hopper's warpgroup MMA. One block of
// 384 threads per work item (64 query rows, a range of keys), three warpgroups:
// - the producer gathers each 64-key tile (64 latent rows of 576 values) into one of two stages of
//   nine 128-byte-swizzled bf16 column blocks and publishes which keys exist; the slots of a tile's
//   rows are loaded a tile ahead. bf16 rows go there with cp.async; fp8_ds_mla rows land raw (each
//   64-value group in half of its own 128-byte destination row) and are dequantised in place, half
//   by the producer and half by warpgroup 1, with the next tile's copies already in flight;
// - warpgroup 0 computes S = Q K^T (m64n64, Q and K from shared memory), masks, runs the online
//   softmax, writes P into the stage's RoPE block (dead once S is done) with the rescale factor
//   of every row, and accumulates O[:, 0:256] += P V[:, 0:256] with P from its registers;
// - warpgroup 1 accumulates O[:, 256:512] += P V[:, 256:512] with P from shared memory.
// A thread holds 128 f32 accumulators of O (m64n256).
// num_splits > 1 writes f32 partials that the combine kernel merges.
//
// Sparse fp8 steps with a multiple of 128 heads run as clusters of two blocks, the two head blocks
// of one token, which read the same keys (FlashMLA's "crossover"): the producer and warpgroup 1
// of each block load the fp8 values of the block's half of a tile's rows into registers a tile
// ahead, and once the stage is free in both blocks dequantise them into their own stage and
// bulk-copy the result into the peer's. Each block converts half as many values, and neither the
// loads' latency nor a staging round trip sits between a stage coming free and its refill.
#include "specula/attention/mla/cuda/kernels/mla_attention.h"

#include <cuda.h>  // CUtensorMap; the encoder comes through the runtime's driver entry point
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include "specula/attention/cuda/kernels/cluster.cuh"
#include "specula/attention/cuda/kernels/convert.cuh"
#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/attention/mla/cuda/kernels/mla_items.cuh"
#include "specula/core/cuda_check.h"

namespace specula::cuda_kernels {

namespace {

using bf16 = __nv_bfloat16;
constexpr float kNegInf = -__builtin_huge_valf();
constexpr int kRows = kMlaBlockRows;
constexpr int kKeys = kMlaBlockKeys;
static_assert(kRows == 64 && kKeys == 64, "one m64 warpgroup tile of rows, one swizzle block of keys");
constexpr int kBlocks = (kMlaLoraRank + kMlaRopeDim) / 64;  // 9 column blocks of 64
constexpr int kBlockBytes = 64 * 128;
constexpr int kTileBytes = kBlocks * kBlockBytes;
constexpr int kRopeBlock = kBlocks - 1;
constexpr int kHalfBlocks = kMlaLoraRank / 64 / 2;  // value columns per warpgroup: 4 blocks
constexpr int kConsumerThreads = 256;
constexpr int kProducerThreads = 128;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters = 224;
static_assert(kProducerThreads * kProducerRegisters + kConsumerThreads * kConsumerRegisters <= 65536);
// fp8_ds_mla tiles: the producer converts column blocks [0, kFp8ProducerBlocks), warpgroup 1 the
// rest of the eight. Measured on the H100 (sparse / dense fp8 TFLOP/s): 0 blocks 293 / 299, 2: 307 /
// 318, 4: 313 / 329, 6: 291 / 310, 8: 282 / 300.
constexpr int kFp8ProducerBlocks = 4;
// Paired blocks: rank r converts tile rows [32 r, 32 r + 32) (four producer threads per row for
// column blocks 0-3, four of warpgroup 1 for 4-7) and receives the other 32 rows' bf16 from its
// peer.
constexpr int kPairRows = kKeys / 2;
constexpr uint32_t kPairTxBytes = kPairRows * kMlaLoraRank * 2;
// Named barriers: Q landed; P of stage s ready (2 + s); the end statistics.
constexpr int kBarQ = 1;
constexpr int kBarP = 2;
constexpr int kBarEnd = 4;
constexpr int kBarPairSent = 5;  // 5 + half: a paired warpgroup's conversions of a tile are done

struct Layout {
  static constexpr int q = 0;
  __host__ __device__ static constexpr int stage(int s) { return (1 + s) * kTileBytes; }
  static constexpr int full = 3 * kTileBytes;    // uint64 [2]: the stage's copies landed
  static constexpr int empty = full + 16;        // uint64 [2]: both warpgroups are done with it
  static constexpr int landed = empty + 16;      // uint64 [2]: fp8 rows' raw copies landed
  static constexpr int valid = landed + 16;      // uint64 [2]: bit k = key k of the tile exists
  static constexpr int alpha = valid + 16;       // f32 [2][64]: rescale of O before the stage's P V
  static constexpr int stats = alpha + 2 * 256;  // f32 [2][64]: row sum and max at the end
  static constexpr int scales = stats + 2 * 256;  // f32 [2][64][4]: fp8 rows' group scales
  static constexpr int bytes = scales + 2 * 1024 + 1024;  // + alignment of the swizzled tiles
};

// The slot of the producer lane's key row in a tile (16 w + lane % 16 of it). Loaded a tile ahead
// of its copies, so the index (and page-table) load is not in the wait for a free stage.
__device__ __forceinline__ int64_t tile_slot(const MlaAttentionParams& p, const mla::Item& it, int tile, int warp) {
  if (tile < 0) return -1;
  return mla::key_slot(p, it, it.key_begin + tile * kKeys + 16 * warp + ((threadIdx.x & 31) & 15));
}

// Publishes for the consumers which of warp w's 16 rows of the tile exist.
__device__ __forceinline__ void publish_valid(int64_t slot, int warp, uint64_t* valid) {
  const uint32_t present = __ballot_sync(0xffffffffu, slot >= 0) & 0xffffu;
  if ((threadIdx.x & 31) == 0) reinterpret_cast<uint16_t*>(valid)[warp] = static_cast<uint16_t>(present);
}

// One 64 x 64 box of a 2-D tensor map into shared memory, counted on `bar` as transaction bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_address(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar))
      : "memory");
}

// Dense steps over a page-64 bf16 cache load whole pages by TMA (`map` over the cache as
// [num_slots, 576] bf16, 64 x 64 boxes, 128-byte swizzle: the stages' layout).
__device__ __forceinline__ bool tma_pages(const MlaAttentionParams& p) {
  return p.slots == nullptr && p.fp8 == 0 && p.page_size == kKeys;
}

// bf16 rows: producer warp w gathers rows 16 w .. 16 w + 15 of every tile with cp.async; lane =
// 8 * (row % 4) + chunk, so eight lanes read 128 contiguous bytes of a row per column block. With
// tma_pages, a tile whose 64 keys all exist is one whole page (tiles start on page boundaries), so
// one thread issues its nine column blocks as tensor copies from the slot of its row 0; a partial
// last tile keeps cp.async, whose missing rows land as zeros.
__device__ void produce_bf16(const MlaAttentionParams& p, const CUtensorMap* map, const mla::Item& it, int num_tiles,
                             uint8_t* smem) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  auto* valid = reinterpret_cast<uint64_t*>(smem + Layout::valid);
  const int warp = (threadIdx.x - kConsumerThreads) >> 5;
  const int lane = threadIdx.x & 31;
  const int chunk = lane & 7;
  int64_t slot = tile_slot(p, it, num_tiles > 0 ? 0 : -1, warp);
  for (int i = 0; i < num_tiles; ++i) {
    const int s = i & 1;
    if (i >= 2) mbarrier_wait(&empty[s], ((i >> 1) - 1) & 1);
    publish_valid(slot, warp, &valid[s]);
    uint8_t* stage = smem + Layout::stage(s);
    if (map != nullptr && it.key_begin + (i + 1) * kKeys <= it.key_end) {
      if (lane == 0) mbarrier_arrive(&full[s]);  // releases the valid bits
      if (threadIdx.x == kConsumerThreads) {
        mbarrier_arrive_expect_tx(&full[s], kTileBytes);
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) tma_load_2d(stage + b * kBlockBytes, map, 64 * b, static_cast<int>(slot), &full[s]);
      } else {
        mbarrier_arrive(&full[s]);
      }
      slot = tile_slot(p, it, i + 1 < num_tiles ? i + 1 : -1, warp);
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
    slot = tile_slot(p, it, i + 1 < num_tiles ? i + 1 : -1, warp);
  }
  // No drain before exiting: the consumers wait on every tile's full barrier, so the block
  // outlives all copies.
}

// fp8_ds_mla rows: the 64 fp8 values of column block b of row r land in one half of that row's
// 128-byte destination (which they will fill as bf16): bytes 64..127 for even rows, 0..63 for odd
// ones, so that reading eight consecutive rows' values covers all 32 banks. The four group scales
// go into a side array and the bf16 RoPE part straight into block 8.
__device__ __forceinline__ int raw_half(int row) { return (~row & 1) * 64; }

__device__ void issue_fp8_tile(const MlaAttentionParams& p, int64_t slot, int warp, uint8_t* stage, float* scales) {
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
__device__ void dequantise_fp8_blocks(int warp, int b_begin, int b_end, uint8_t* stage, const float* scales) {
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
__device__ void produce_fp8(const MlaAttentionParams& p, const mla::Item& it, int num_tiles, uint8_t* smem) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  auto* valid = reinterpret_cast<uint64_t*>(smem + Layout::valid);
  auto* scales = reinterpret_cast<float*>(smem + Layout::scales);
  auto* landed = reinterpret_cast<uint64_t*>(smem + Layout::landed);
  const int warp = (threadIdx.x - kConsumerThreads) >> 5;
  int issued = 0;
  int64_t slot = tile_slot(p, it, num_tiles > 0 ? 0 : -1, warp);
  auto issue = [&]() {
    const int s = issued & 1;
    publish_valid(slot, warp, &valid[s]);
    issue_fp8_tile(p, slot, warp, smem + Layout::stage(s), scales + s * kRows * 4);
    mbarrier_arrive_cp_async(&landed[s]);
    ++issued;
    slot = tile_slot(p, it, issued < num_tiles ? issued : -1, warp);
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
  static constexpr int kBlocksPerThread = (kBlocks - 1) / 2;
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
  sh.scales = slot >= 0 ? __ldg(reinterpret_cast<const float2*>(row + kMlaLoraRank + 8 * kHalf)) : make_float2(0.0f, 0.0f);
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

// Once a warpgroup's 128 threads have stored their blocks of the block's 32 rows of a tile (each
// fenced for the async proxy), one of them bulk-copies those rows of each block (4 KB, contiguous)
// into the peer's stage, counted on the peer's full barrier. One copy per column block instead of
// a 16-byte remote store per chunk: per-chunk st.async (each counted on the peer's mbarrier)
// measured 308 TFLOP/s, these copies 366 (H200, sparse fp8 h128 q2).
template <int kHalf>
__device__ __forceinline__ void pair_send(int rank, uint8_t* stage, uint64_t* full) {
  named_barrier_sync(kBarPairSent + kHalf, 128);
  if ((threadIdx.x & 127) != 0) return;
  constexpr int kN = PairShare::kBlocksPerThread;
  const uint32_t peer = static_cast<uint32_t>(rank) ^ 1u;
  const uint32_t peer_full = cluster_map(full, peer);
#pragma unroll
  for (int b = 0; b < kN; ++b) {
    const uint8_t* rows = stage + (kN * kHalf + b) * kBlockBytes + kPairRows * rank * 128;
    bulk_copy_to_peer(cluster_map(rows, peer), rows, kPairRows * 128, peer_full);
  }
}

// Paired blocks' producer: the existence bits and the bf16 RoPE parts (cp.async) of all 64 rows of
// every tile, and its share (blocks 0-3) of the block's 32 rows. A stage is free once both blocks'
// consumers are done with it, since the peer writes into it too. (Sending the RoPE part through
// the pair as well measured 352 TFLOP/s against 366.)
__device__ void produce_pair(const MlaAttentionParams& p, const mla::Item& it, int num_tiles, uint8_t* smem) {
  auto* full = reinterpret_cast<uint64_t*>(smem + Layout::full);
  auto* empty = reinterpret_cast<uint64_t*>(smem + Layout::empty);
  auto* valid = reinterpret_cast<uint64_t*>(smem + Layout::valid);
  const int warp = (threadIdx.x - kConsumerThreads) >> 5;
  const int lane = threadIdx.x & 31;
  const int rank = static_cast<int>(cluster_rank());
  const int row = pair_row(rank);
  // The share's slot is looked up a tile before its loads, so they never wait for it.
  auto own_slot = [&](int tile) { return mla::key_slot(p, it, it.key_begin + tile * kKeys + row); };
  PairShare share;
  if (num_tiles > 0) pair_load<0>(p, own_slot(0), share);
  int64_t next_own = own_slot(1);
  int64_t slot = tile_slot(p, it, num_tiles > 0 ? 0 : -1, warp);
  for (int i = 0; i < num_tiles; ++i) {
    const int s = i & 1;
    if (i >= 2) mbarrier_wait(&empty[s], ((i >> 1) - 1) & 1);
    publish_valid(slot, warp, &valid[s]);
    uint8_t* stage = smem + Layout::stage(s);
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
    pair_send<0>(rank, stage, &full[s]);
    if (i + 1 < num_tiles) {
      pair_load<0>(p, next_own, share);
      next_own = own_slot(i + 2);
      slot = tile_slot(p, it, i + 1, warp);
    }
  }
}

// Arrives on this block's mbarrier and, paired, on the peer's copy of it.
template <bool kPair>
__device__ __forceinline__ void arrive_here_and_peer(uint64_t* bar) {
  mbarrier_arrive(bar);
  if constexpr (kPair) mbarrier_arrive_cluster(cluster_map(bar, cluster_rank() ^ 1u));
}

// Which keys the rows of this thread may see beyond the tile's existence bits (dense steps: the
// causal limit of the row's token and, for tree verification, its draft-token bits).
struct RowRules {
  int limit[2];
  uint64_t bits[2];
  int min_limit;  // the block's smallest limit: tiles wholly below it need no per-row mask
  int draft0;     // first draft-token key position (tree steps)
  bool tree;
  bool dense;
};

__device__ RowRules row_rules(const MlaAttentionParams& p, const mla::Item& it, int row_base) {
  RowRules rr{};
  rr.dense = p.slots == nullptr;
  rr.tree = rr.dense && p.tree_bits != nullptr;
  rr.min_limit = INT32_MAX;
  rr.draft0 = INT32_MAX;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    rr.limit[i] = INT32_MAX;
    rr.bits[i] = ~0ull;
  }
  if (!rr.dense) return rr;
  const int H = p.num_q_heads;
  const int first = p.first_token[it.unit];
  rr.draft0 = it.kv_len - it.q_len;
  rr.min_limit = rr.draft0 + static_cast<int>(it.row0 / H) - first;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row_base + 8 * i;
    if (r >= it.rows) continue;  // its scores are never written
    const int token = static_cast<int>((it.row0 + r) / H);
    rr.limit[i] = rr.draft0 + token - first;
    if (rr.tree) rr.bits[i] = p.tree_bits[token];
  }
  return rr;
}

// O's two rows of this thread times their rescale factors. Once a row's maximum has settled its
// factor is exactly 1 (exp2 of 0); with kSkipOnes a warp whose 16 rows all have 1 skips the 128
// multiplies (the same bits: x * 1 = x). Measured on the H200 (TFLOP/s, the skip against none):
// fp8 dense 339 / 330, sparse 322 / 314; bf16 dense 462 / 520, sparse 440 / 499, so only the fp8
// kernel skips.
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
  const uint32_t q_addr = smem_address(smem + Layout::q);
  float s[8][4];
  uint32_t pf[4][4];
  for (int i = 0; i < num_tiles; ++i) {
    const int st = i & 1;
    mbarrier_wait(&full[st], (i >> 1) & 1);
    fence_proxy_async();
    const uint32_t k_addr = smem_address(smem + Layout::stage(st));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBlocks * 4; ++ks) {
      const uint32_t off = (ks / 4) * kBlockBytes + (ks % 4) * 32;
      wgmma_ss<64, bf16>(s, wgmma_desc(q_addr + off, 0), wgmma_desc(k_addr + off, 0), ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);

    const int key0 = it.key_begin + i * kKeys;
    const uint64_t exists = valid[st];
    const bool per_row =
        rules.dense && (key0 + kKeys - 1 > rules.min_limit || (rules.tree && key0 + kKeys > rules.draft0));
    if (exists != ~0ull || per_row) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = 8 * j + 2 * t + (e & 1);
          const int r = e >> 1;
          bool visible = (exists >> key) & 1ull;
          if (per_row) {
            const int pos = key0 + key;
            visible = visible && pos <= rules.limit[r] &&
                      (pos < rules.draft0 || !rules.tree || ((rules.bits[r] >> (pos - rules.draft0)) & 1ull));
          }
          if (!visible) s[j][e] = kNegInf;
        }
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = kNegInf;
#pragma unroll
      for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx * p.scale_log2);
      // A row that has seen no key keeps -inf; subtracting 0 instead avoids inf - inf.
      const float base = m_new == kNegInf ? 0.0f : m_new;
      alpha[r] = exp2f(m[r] - base);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s[j][2 * r] = exp2f(fmaf(s[j][2 * r], p.scale_log2, -base));
        s[j][2 * r + 1] = exp2f(fmaf(s[j][2 * r + 1], p.scale_log2, -base));
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      l[r] = l[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      pf[kk][0] = pack2<bf16>(s[2 * kk][0], s[2 * kk][1]);
      pf[kk][1] = pack2<bf16>(s[2 * kk][2], s[2 * kk][3]);
      pf[kk][2] = pack2<bf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[kk][3] = pack2<bf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    // P (bf16, as this warpgroup multiplies it) into the stage's RoPE block, for warpgroup 1.
    uint8_t* p_block = smem + Layout::stage(st) + kRopeBlock * kBlockBytes;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 16 * kk + 8 * h + 2 * t;
        *reinterpret_cast<uint32_t*>(p_block + swizzled_offset(kRows, row_base, col)) = pf[kk][2 * h];
        *reinterpret_cast<uint32_t*>(p_block + swizzled_offset(kRows, row_base + 8, col)) = pf[kk][2 * h + 1];
      }
    }
    if (t == 0) {
      alpha_out[st * kRows + row_base] = alpha[0];
      alpha_out[st * kRows + row_base + 8] = alpha[1];
    }
    fence_proxy_async();
    named_barrier_arrive(kBarP + st, kConsumerThreads);
    rescale_rows<kFp8>(o, alpha[0], alpha[1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs_mn<256, bf16>(o, pf[kk], wgmma_desc(k_addr + kk * 16 * 128, kBlockBytes));
    wgmma_commit();
    // Waiting here rather than behind the next S hands the stage back a whole S earlier; the
    // tensor cores meanwhile run warpgroup 1's half.
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pf);
    __syncwarp();  // every lane's P stores precede the release
    if (lane == 0) arrive_here_and_peer<kPair>(&empty[st]);
  }
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
  auto own_slot = [&](int tile) { return mla::key_slot(p, it, it.key_begin + tile * kKeys + row); };
  PairShare share;
  int64_t next_own = -1;  // the next share's slot, looked up a tile before its loads
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
    pair_send<1>(rank, stage, &full[s]);
    if (tile + 1 < num_tiles) {
      pair_load<1>(p, next_own, share);
      next_own = own_slot(tile + 2);
    }
  };
  if constexpr (kPair) {
    if (num_tiles > 0) pair_load<1>(p, own_slot(0), share);
    next_own = own_slot(1);
    for (int t = 0; t < 2 && t < num_tiles; ++t) pair_convert(t);  // both stages start free
  }
  for (int i = 0; i < num_tiles; ++i) {
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
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_ss_mn<256, bf16>(o, wgmma_desc(k_addr + kRopeBlock * kBlockBytes + kk * 32, 0),
                             wgmma_desc(k_addr + kHalfBlocks * kBlockBytes + kk * 16 * 128, kBlockBytes));
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
  }
}

// kPair: sparse fp8 steps as clusters of two blocks (see the top of the file).
template <bool kFp8, bool kPair>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_kernel(const MlaAttentionParams p,
                                                                     const __grid_constant__ CUtensorMap cache_map) {
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
  if constexpr (kPair) {
    // The peer arrives on these barriers and writes into the stages: neither block starts before
    // both have initialised them, and neither exits while the other may still reach into it.
    if (threadIdx.x == 0) fence_mbarrier_init_cluster();
    cluster_sync();
  } else {
    __syncthreads();
  }
  if (threadIdx.x >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    if constexpr (kPair) {
      produce_pair(p, it, num_tiles, smem);
      cluster_sync();
    } else if constexpr (kFp8) {
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

  // Q: 64 rows x 576 as nine swizzled column blocks; rows past the block's are zero.
  const auto* q = static_cast<const uint8_t*>(p.q);
  for (int c = threadIdx.x; c < kRows * kBlocks * 8; c += kConsumerThreads) {
    const int row = c / (kBlocks * 8);
    const int chunk = c % (kBlocks * 8);
    const bool ok = row < it.rows;
    const uint8_t* src = q + (ok ? (it.row0 + row) * (kBlocks * 128) + chunk * 16 : 0);
    cp_async_16(smem + Layout::q + swizzled_offset(kRows, row, chunk * 8), src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
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
  named_barrier_sync(kBarEnd, kConsumerThreads);
  if constexpr (kPair) cluster_sync();
  if (wg == 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = stats[row_base + 8 * r];
      m[r] = stats[kRows + row_base + 8 * r];
    }
  }

  // Normalise and write this warpgroup's 256 columns (partials in f32 when the keys are split).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row_in = row_base + 8 * r;
    if (row_in >= it.rows) continue;
    const int64_t row = it.row0 + row_in;
    const float lse2 = l[r] > 0.0f ? m[r] + log2f(l[r]) : kNegInf;
    float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    if (p.num_splits > 1) {
      const int64_t part_row = static_cast<int64_t>(it.split) * p.num_tokens * p.num_q_heads + row;
      float* dst = p.part_o + part_row * kMlaLoraRank + wg * 256;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      }
      if (t == 0 && wg == 0) p.part_lse[part_row] = lse2;
      continue;
    }
    float lse = lse2 * 0.6931471805599453f;
    if (p.sinks != nullptr) {
      const float sink = p.sinks[row % p.num_q_heads];
      const float mm = fmaxf(lse, sink);
      const float merged = mm + logf(expf(lse - mm) + expf(sink - mm));
      inv *= expf(lse - merged);
      lse = merged;
    }
    auto* out = static_cast<bf16*>(p.out) + row * kMlaLoraRank + wg * 256;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) = pack2<bf16>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (p.lse != nullptr && t == 0 && wg == 0) p.lse[row] = lse;
  }
}

// One block per query row: merges its splits (log2-domain LSEs), folds in the sink, writes bf16.
__global__ void __launch_bounds__(128) mla_combine_kernel(const MlaAttentionParams p) {
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
  if (p.sinks != nullptr) {
    const float sink = p.sinks[row % p.num_q_heads];
    const float mm = fmaxf(lse, sink);
    const float merged = mm + logf(expf(lse - mm) + expf(sink - mm));
    inv *= expf(lse - merged);
    lse = merged;
  }
  auto* out = static_cast<__nv_bfloat16*>(p.out) + row * kMlaLoraRank + threadIdx.x * 4;
  *reinterpret_cast<uint32_t*>(out) = pack2<__nv_bfloat16>(o[0] * inv, o[1] * inv);
  *reinterpret_cast<uint32_t*>(out + 2) = pack2<__nv_bfloat16>(o[2] * inv, o[3] * inv);
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[row] = lse;
}

}  // namespace

// The cache as a [num_slots, 576] bf16 tensor map with 64 x 64 boxes and the 128-byte swizzle.
CUtensorMap cache_tensor_map(const MlaAttentionParams& p) {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    SPECULA_REQUIRE(found == cudaDriverEntryPointSuccess && fn != nullptr,
                    "MLA: the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kBlocks * 64), static_cast<cuuint64_t>(p.num_slots)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.row_bytes)};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint8_t*>(p.cache), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SPECULA_REQUIRE(r == CUDA_SUCCESS, "MLA: encoding the cache's tensor map failed (CUresult " + std::to_string(r) +
                                         ", " + std::to_string(p.num_slots) + " rows of " +
                                         std::to_string(p.row_bytes) + " bytes)");
  return map;
}

void launch_mla_attention(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.max_items == 0) return;
  const bool paired = params.fp8 != 0 && params.slots != nullptr && params.num_q_heads % (2 * kRows) == 0;
  const auto kernel = paired            ? mla_attention_kernel<true, true>
                      : params.fp8 != 0 ? mla_attention_kernel<true, false>
                                        : mla_attention_kernel<false, false>;
  // The attribute belongs to the current device's context: set on every launch (it is cheap), so a
  // second GPU in the process gets it too.
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout::bytes));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(params.max_items));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Layout::bytes;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = paired ? 1 : 0;
  const bool tma = params.slots == nullptr && params.fp8 == 0 && params.page_size == kKeys;
  const CUtensorMap map = tma ? cache_tensor_map(params) : CUtensorMap{};
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params, map));
}

void launch_mla_combine(const MlaAttentionParams& params, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_q_heads;
  if (rows == 0 || params.num_splits <= 1) return;
  mla_combine_kernel<<<static_cast<unsigned>(rows), kMlaLoraRank / 4, 0, stream>>>(params);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
