// What the MLA attention kernel's warpgroups share (mla_attention.cu): the block's shape and
// register split, the named barriers, the shared-memory layout of Q and the two stages of 64-key
// tiles (nine 128-byte-swizzled column blocks of 64 bf16 each), and the producers' per-tile slot
// lookups and existence bits.
#pragma once

#include <cstdint>

#include "specula/attention/mla/cuda/kernels/mla_attention.h"
#include "specula/attention/mla/cuda/kernels/mla_items.cuh"

namespace specula::cuda_kernels::mla {

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
// setmaxnreg only moves the registers the block launched with (168 a thread for 384 threads), not
// the SM's 65536. A split past that makes the consumers' setmaxnreg.inc wait forever (an 80 / 216
// / 216 split hung on the H200).
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
static_assert(kProducerThreads * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
              kThreads * kLaunchRegisters);
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
constexpr int kBarOut = 7;  // 7 + wg: a warpgroup's output rows are staged for TMA (mla_rows.cuh)

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

// The slot of the producer lane's key row in a tile (16 w + lane % 16 of it). Fetched a tile ahead
// of its copies, so the index (and page-table) load is not in the wait for a free stage.
__device__ __forceinline__ mla::SlotRef tile_slot(const MlaAttentionParams& p, const mla::Item& it, int tile,
                                                  int warp) {
  if (tile < 0) return {-1, 0};
  return mla::fetch_slot(p, it, it.key_begin + tile * kKeys + 16 * warp + ((threadIdx.x & 31) & 15));
}

// Publishes for the consumers which of warp w's 16 rows of the tile exist.
__device__ __forceinline__ void publish_valid(int64_t slot, int warp, uint64_t* valid) {
  const uint32_t present = __ballot_sync(0xffffffffu, slot >= 0) & 0xffffu;
  if ((threadIdx.x & 31) == 0) reinterpret_cast<uint16_t*>(valid)[warp] = static_cast<uint16_t>(present);
}

}  // namespace specula::cuda_kernels::mla
