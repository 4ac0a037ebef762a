// Prefill / extend / verify attention on Hopper's warpgroup MMA, for caches of the query's 16-bit
// type at head_dim 64 and 128, and bf16 at query/key width 192 with value width 128 (MLA in the
// expanded form, over ragged K/V rows); prefill.cu serves the other cases on mma.sync.
//
// One block per (query head, work item of kPrefillTileRows = 128 query rows): two consumer
// warpgroups of 64 rows each and one producer warpgroup.
// - The producer gathers K and V tiles of 128 keys page by page with cp.async (ragged rows, which
//   are contiguous, by TMA from one thread) into rings of 128-byte-swizzled tiles: three slots
//   each at head_dim 64 and 128, two at 192 / 128. K and V have their own `full` mbarriers (the
//   copies landed) and `empty` ones (both warpgroups are done reading): a tile's K is free as
//   soon as its S is done, its V only after the next tile's batch, so where two slots are all
//   that fit, the producer refills V one tile behind K and each copy still starts a whole tile
//   before it is needed.
// - Each consumer warpgroup keeps S (64 x 128 scores), O (64 x head_dim) and the probabilities P
//   in registers. Per tile it issues, in one batch, O += P(previous tile) V(previous tile) and
//   S = Q K^T, then runs the masks and the online softmax on S while the tensor cores work.
// - The two warpgroups take turns issuing their batches (named barriers), so one's softmax runs
//   while the other's matrix products do: the tensor cores are not left idle during exp2.
#include "specula/attention/cuda/kernels/prefill_wgmma.h"

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "specula/attention/cuda/kernels/cluster.cuh"
#include "specula/core/convert.cuh"
#include "specula/attention/cuda/kernels/io.cuh"
#include "specula/attention/cuda/kernels/keep_bits.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"
#include "specula/attention/cuda/kernels/prefill_epilogue.cuh"
#include "specula/attention/cuda/kernels/tensor_map.h"
#include "specula/attention/cuda/kernels/tma.cuh"
#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"

namespace specula::cuda_kernels {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr int kRows = kPrefillTileRows;
static_assert(kRows == 128, "two warpgroups of 64 query rows");
constexpr int kKeys = 128;
static_assert(kKeys == 128, "the dual chunk keep windows are two of 64 keys per tile");
constexpr int kConsumerThreads = 256;
constexpr int kProducerThreads = 128;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
static_assert(kProducerThreads == kKeys, "one producer thread per key row of a tile");
// Registers per thread after the warpgroups rebalance them (the block starts with 65536 / 384):
// the producer needs few, the consumers hold S, O and P.
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters = 224;
static_assert(kProducerThreads * kProducerRegisters + kConsumerThreads * kConsumerRegisters <= 65536);
// Named barrier ids: 1 + w is warpgroup w's turn to issue; kQReady orders the Q tile.
constexpr int kQReady = 3;

// DK: query/key width, DV: value width. As many slots of K and V tiles as fit beside Q (three at
// head_dim 64 and 128, two at 192 / 128).
template <int DK, int DV>
struct Layout {
  static constexpr int kChunks = DK / 8;                    // 16-byte chunks per Q row
  static constexpr int kQBytes = kRows * DK * 2;
  static constexpr int kKTileBytes = kKeys * DK * 2;
  static constexpr int kVTileBytes = kKeys * DV * 2;
  static constexpr int kBarrierBytes = 4 * 3 * sizeof(uint64_t);
  static constexpr int kFit = (227 * 1024 - 1024 - kQBytes - kBarrierBytes) / (kKTileBytes + kVTileBytes);
  static constexpr int kStages = kFit < 3 ? kFit : 3;
  static_assert(kStages >= 2, "two slots of K and V tiles must fit beside Q");
  // With two slots, refilling a tile's K and V together would wait for the previous tile's P V
  // and leave one softmax to hide the copy; V is then refilled one tile behind K instead.
  static constexpr bool kLagV = kStages == 2;
  static constexpr size_t kVRingOffset = static_cast<size_t>(kStages) * kKTileBytes;
  static constexpr size_t kSmemBytes =
      1024 + kQBytes + static_cast<size_t>(kStages) * (kKTileBytes + kVTileBytes) + kBarrierBytes;
};

// The ring barriers: full (the copies landed; one arrival per producing thread) and empty (one
// arrival per consumer warp), for K and for V.
struct RingBarriers {
  uint64_t* full_k;
  uint64_t* full_v;
  uint64_t* empty_k;
  uint64_t* empty_v;
};

// Copies rows row0 .. row0 + 31 of a swizzled tile of D-wide rows from `cache`, and of a second
// tile from `cache2` when kPair (K and V of the same width: one slot lookup for both); lane
// l's `slot` is row row0 + l's cache slot (-1: zeros).
template <int D, bool kPair, typename T>
__device__ __forceinline__ void copy_tile_rows(unsigned char* tile, const T* cache, unsigned char* tile2,
                                               const T* cache2, int32_t slot, int row0, int num_kv_heads,
                                               int kv_head) {
  constexpr int kChunks = D / 8;
  const int lane = threadIdx.x & 31;
  auto copy_chunk = [&](int r, int ch) {
    const int sl = __shfl_sync(0xffffffffu, slot, r);
    const bool valid = sl >= 0;
    const int64_t offset = (static_cast<int64_t>(valid ? sl : 0) * num_kv_heads + kv_head) * D + ch * 8;
    const int dst = swizzled_offset(kKeys, row0 + r, ch * 8);
    cp_async_16(tile + dst, cache + offset, valid);
    if constexpr (kPair) cp_async_16(tile2 + dst, cache2 + offset, valid);
  };
  if constexpr (32 % kChunks == 0) {
    // Whole rows per pass: each lane keeps one chunk column.
    constexpr int kRowsPerPass = 32 / kChunks;
#pragma unroll 4
    for (int pass = 0; pass < 32 / kRowsPerPass; ++pass) copy_chunk(pass * kRowsPerPass + lane / kChunks, lane % kChunks);
  } else {
#pragma unroll 4
    for (int it = 0; it < kChunks; ++it) {
      const int c = it * 32 + lane;
      copy_chunk(c / kChunks, c % kChunks);
    }
  }
}

// A D-wide tile of ragged K/V filled by the producer's first warp alone, counted on `full` by its
// 32 lanes. A tile wholly inside the sequence is one box of 128 contiguous rows per 64 columns
// (`map`: [rows, num_kv_heads, D]), which lane 0 issues by TMA with its bytes from row `row`. The
// sequence's last, partial tile goes by cp.async, four rows per lane, so its missing rows land as
// zeros and P = 0 never meets rows of another sequence or past the tensor.
template <int D, typename T>
__device__ __forceinline__ void fill_ragged_tile(unsigned char* tile, const T* cache, const CUtensorMap* map, int row,
                                                 int rows_valid, int num_kv_heads, int kv_head, uint64_t* full) {
  const int lane = threadIdx.x & 31;
  if (rows_valid < kKeys) {
#pragma unroll
    for (int q = 0; q < kKeys / 32; ++q) {
      const int r = 32 * q + lane;
      copy_tile_rows<D, false>(tile, cache, nullptr, cache, r < rows_valid ? row + r : -1, 32 * q, num_kv_heads,
                               kv_head);
    }
    mbarrier_arrive_cp_async(full);
    return;
  }
  if (lane != 0) {
    mbarrier_arrive(full);
    return;
  }
  mbarrier_arrive_expect_tx(full, kKeys * D * 2);
#pragma unroll
  for (int cb = 0; cb < D / 64; ++cb) tma_load_3d(tile + cb * kKeys * 128, map, cb * 64, kv_head, row, full);
}

// The producer. Ragged K/V (pages == nullptr): its first warp fills every tile by TMA
// (fill_ragged_tile) and the others leave. Paged: warp w gathers rows 32 w .. 32 w + 31 of every
// K and V tile with cp.async. With two slots per ring, step i fills V of tile i - 1, then K of
// tile i.
template <typename T, int DK, int DV>
__device__ void produce(const AttentionParams& p, const int32_t* pages, int64_t row_start, int kv_head, int kv_len,
                        int tile_first, int num_tiles, unsigned char* k_ring, unsigned char* v_ring,
                        const RingBarriers& bar, const CUtensorMap* k_map, const CUtensorMap* v_map) {
  using L = Layout<DK, DV>;
  constexpr int kStages = L::kStages;
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  const int lane = threadIdx.x & 31;
  const int row0 = 32 * ((threadIdx.x - kConsumerThreads) / 32);
  const bool ragged = pages == nullptr;
  if (ragged && row0 > 0) return;
  // Paged: the cache slot of tile i's key row0 + lane (-1 past the sequence).
  auto lookup = [&](int i) {
    const int j = (tile_first + i) * kKeys + row0 + lane;
    return j < kv_len ? pages[j / p.page_size] * p.page_size + j % p.page_size : -1;
  };
  auto wait_free = [&](uint64_t* empty, int i) {
    if (i >= kStages) mbarrier_wait(&empty[i % kStages], ((i / kStages) - 1) & 1);
  };
  auto k_tile = [&](int i) { return k_ring + (i % kStages) * L::kKTileBytes; };
  auto v_tile = [&](int i) { return v_ring + (i % kStages) * L::kVTileBytes; };
  if (ragged) {
    auto fill = [&](auto width, int t, unsigned char* tile, const T* cache, const CUtensorMap* map, uint64_t* full) {
      const int start = (tile_first + t) * kKeys;
      fill_ragged_tile<decltype(width)::value>(tile, cache, map, static_cast<int>(row_start + start), kv_len - start,
                                               p.num_kv_heads, kv_head, full);
    };
    for (int i = 0; i <= num_tiles; ++i) {
      if (i > 0) {
        wait_free(bar.empty_v, i - 1);
        fill(std::integral_constant<int, DV>{}, i - 1, v_tile(i - 1), v_cache, v_map, &bar.full_v[(i - 1) % kStages]);
      }
      if (i < num_tiles) {
        wait_free(bar.empty_k, i);
        fill(std::integral_constant<int, DK>{}, i, k_tile(i), k_cache, k_map, &bar.full_k[i % kStages]);
      }
    }
    cp_async_wait<0>();  // the partial tile's copies
    return;
  }
  if constexpr (L::kLagV) {
    int32_t slot_prev = -1;
    for (int i = 0; i <= num_tiles; ++i) {
      const int32_t slot = i < num_tiles ? lookup(i) : -1;
      if (i > 0) {
        wait_free(bar.empty_v, i - 1);
        copy_tile_rows<DV, false>(v_tile(i - 1), v_cache, nullptr, v_cache, slot_prev, row0, p.num_kv_heads,
                                  kv_head);
        mbarrier_arrive_cp_async(&bar.full_v[(i - 1) % kStages]);
      }
      if (i < num_tiles) {
        wait_free(bar.empty_k, i);
        copy_tile_rows<DK, false>(k_tile(i), k_cache, nullptr, k_cache, slot, row0, p.num_kv_heads, kv_head);
        mbarrier_arrive_cp_async(&bar.full_k[i % kStages]);
      }
      slot_prev = slot;
    }
  } else {
    static_assert(DK == DV, "K and V copied together share one slot lookup");
    for (int i = 0; i < num_tiles; ++i) {
      const int32_t slot = lookup(i);
      wait_free(bar.empty_k, i);
      wait_free(bar.empty_v, i);
      copy_tile_rows<DK, true>(k_tile(i), k_cache, v_tile(i), v_cache, slot, row0, p.num_kv_heads, kv_head);
      mbarrier_arrive_cp_async(&bar.full_k[i % kStages]);
      mbarrier_arrive_cp_async(&bar.full_v[i % kStages]);
    }
  }
  cp_async_wait<0>();  // no copy may be in flight when this thread exits
}

template <typename T, int DK, int DV>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wgmma_kernel(const AttentionParams p, const PrefillWork work, const __grid_constant__ CUtensorMap k_map,
                         const __grid_constant__ CUtensorMap v_map) {
  using L = Layout<DK, DV>;
  constexpr int kStages = L::kStages;
  pdl_wait();
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sQ = smem_raw + ((1024u - (smem_address(smem_raw) & 1023u)) & 1023u);
  unsigned char* k_ring = sQ + L::kQBytes;
  unsigned char* v_ring = k_ring + L::kVRingOffset;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(v_ring + kStages * L::kVTileBytes);
  const RingBarriers bar{barriers, barriers + kStages, barriers + 2 * kStages, barriers + 3 * kStages};

  int item = 0;
  int head = 0;
  prefill_block_work(static_cast<int>(blockIdx.x), work.num_items, p.num_q_heads, work.heads_per_group, item, head);
  const int seq = work.items[2 * item];
  const int q_tile = work.items[2 * item + 1];
  const int kv_head = head / (p.num_q_heads / p.num_kv_heads);
  const int q_start = p.cu_seqlens_q[seq];
  const int q_len = p.cu_seqlens_q[seq + 1] - q_start;
  const int kv_len = p.seq_lens_k[seq];
  const int q_kv_offset = p.q_kv_offset != nullptr ? p.q_kv_offset[seq] : kv_len - q_len;
  const int rows_valid = min(kRows, q_len - q_tile);
  const int pos_min = q_kv_offset + q_tile;
  const int pos_max = pos_min + rows_valid - 1;
  const bool custom = p.custom_mask != nullptr;
  const bool causal = p.causal && !custom;
  const int kv_end = causal ? min(kv_len, pos_max + 1) : kv_len;
  const int kv_begin = p.window_left >= 0 ? max(0, pos_min - p.window_left) : 0;
  const int tile_first = kv_begin / kKeys;
  const int num_tiles = max(0, (kv_end + kKeys - 1) / kKeys - tile_first);
  const bool ragged = p.kv_row_start != nullptr;
  const int32_t* pages = ragged ? nullptr : p.page_table + static_cast<int64_t>(seq) * p.page_table_stride;
  const int64_t row_start = ragged ? p.kv_row_start[seq] : 0;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // One arrival per producing thread: the whole warpgroup, or its first warp over ragged K/V.
      const int producers = ragged ? 32 : kProducerThreads;
      mbarrier_init(&bar.full_k[s], producers);
      mbarrier_init(&bar.full_v[s], producers);
      mbarrier_init(&bar.empty_k[s], 8);  // one arrival per consumer warp
      mbarrier_init(&bar.empty_v[s], 8);
    }
    fence_mbarrier_init_cluster();
  }
  __syncthreads();

  if (threadIdx.x >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    produce<T, DK, DV>(p, pages, row_start, kv_head, kv_len, tile_first, num_tiles, k_ring, v_ring, bar, &k_map,
                       &v_map);
    return;
  }

  setmaxnreg_inc<kConsumerRegisters>();
  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  // Q tile; rows past the sequence are zero.
  const T* q = static_cast<const T*>(p.q);
  for (int c = threadIdx.x; c < kRows * L::kChunks; c += kConsumerThreads) {
    const int r = c / L::kChunks;
    const int ch = c % L::kChunks;
    const bool valid = r < rows_valid;
    const T* src = q + static_cast<int64_t>(q_start + q_tile + (valid ? r : 0)) * p.q_stride_token +
                   static_cast<int64_t>(head) * p.q_stride_head + ch * 8;
    cp_async_16(sQ + swizzled_offset(kRows, r, ch * 8), src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  named_barrier_sync(kQReady, kConsumerThreads);
  if (wg == 1) named_barrier_arrive(1, kConsumerThreads);  // warpgroup 0 issues first

  float o[DV / 8][4];
#pragma unroll
  for (int nt = 0; nt < DV / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float s[kKeys / 8][4];
  uint32_t pf[kKeys / 16][4];
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.0f, 0.0f};
  const float score_mul = p.scale * p.k_descale * (p.seq_score_scale != nullptr ? p.seq_score_scale[seq] : 1.0f);
  const bool capped = p.logit_cap > 0.0f;
  const float cap_mul = capped ? score_mul / p.logit_cap : 0.0f;
  const float cap_log2 = p.logit_cap * kLog2e;
  const float unit = capped ? 1.0f : score_mul * kLog2e;  // raw score -> log2 units
  const int64_t mask_offset = custom ? p.mask_offsets[seq] : 0;
  const int keep_run = p.keep_run != nullptr ? p.keep_run[seq] : -1;
  const bool sparse = keep_run >= 0;
  const int64_t keep_at = sparse ? (static_cast<int64_t>(keep_run) * p.num_q_heads + head) * p.keep_words : 0;
  const int key_base = sparse ? p.key_base[seq] : 0;
  const int q_base = sparse ? p.q_base[seq] : 0;
  const uint32_t q_addr = smem_address(sQ) + wg * 64 * 128;
  const int row_base = wg * 64 + warp * 16 + g;  // this thread's rows: row_base and row_base + 8

  for (int i = 0; i < num_tiles; ++i) {
    const int stage = i % kStages;
    const int prev = (i + kStages - 1) % kStages;
    const int tile_start = (tile_first + i) * kKeys;
    // Dual chunk sparse runs: the tile's kept columns (bit jj of window jj / 64), and per row of
    // this thread the kept distances of its keys (bit 127 - jj). Loaded before the tile's products
    // are issued, so that their latency passes while the tensor cores work.
    uint64_t keep_col[2] = {0, 0}, keep_dist[2][2] = {{0, 0}, {0, 0}};
    if (sparse) {
      const int64_t key0 = static_cast<int64_t>(key_base) + tile_start;
#pragma unroll
      for (int h = 0; h < 2; ++h) keep_col[h] = bits64(p.keep_cols + keep_at, p.keep_words, key0 + 64 * h);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int64_t first = q_base + q_tile + row_base + 8 * rr - key0 - (kKeys - 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) keep_dist[rr][h] = bits64(p.keep_dists + keep_at, p.keep_words, first + 64 * h);
      }
    }
    mbarrier_wait(&bar.full_k[stage], (i / kStages) & 1);
    if (i > 0) mbarrier_wait(&bar.full_v[prev], ((i - 1) / kStages) & 1);
    fence_proxy_async();
    const uint32_t k_addr = smem_address(k_ring + stage * L::kKTileBytes);
    named_barrier_sync(1 + wg, kConsumerThreads);
    wgmma_fence();
    if (i > 0) {
      const uint32_t v_addr = smem_address(v_ring + prev * L::kVTileBytes);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        wgmma_rs_mn<DV, T>(o, pf[kk], wgmma_desc(v_addr + kk * 16 * 128, kKeys * 128));
      }
    }
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) {
      const uint32_t a = q_addr + (ks / 4) * kRows * 128 + (ks % 4) * 32;
      const uint32_t b = k_addr + (ks / 4) * kKeys * 128 + (ks % 4) * 32;
      wgmma_ss<kKeys, T>(s, wgmma_desc(a, 0), wgmma_desc(b, 0), ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    named_barrier_arrive(2 - wg, kConsumerThreads);
    wgmma_wait<0>();
    fence_operands(s);
    fence_operands(o);
    fence_operands(pf);
    if (lane == 0) {
      mbarrier_arrive(&bar.empty_k[stage]);
      if (i > 0) mbarrier_arrive(&bar.empty_v[prev]);
    }

    // Soft-cap (in log2 units) or leave the scale to the softmax; masks only on tiles that need
    // them, so the common tile runs without a branch per score.
    if (capped) {
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = cap_log2 * tanhf(s[nt][e] * cap_mul);
      }
    }
    const bool need_mask = !(tile_start + kKeys <= kv_len && (!causal || tile_start + kKeys - 1 <= pos_min) &&
                             (p.window_left < 0 || tile_start >= pos_max - p.window_left) && !custom);
    if (need_mask) {
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = q_tile + row_base + (e >= 2 ? 8 : 0);
          const int j = tile_start + nt * 8 + 2 * t + (e & 1);
          const int pos = q_kv_offset + qi;
          bool visible = j < kv_len && (!causal || j <= pos) && (p.window_left < 0 || j >= pos - p.window_left);
          if (custom && qi < q_len && j < kv_len) {
            visible = visible && p.custom_mask[mask_offset + static_cast<int64_t>(qi) * kv_len + j] != 0;
          }
          if (sparse) {
            // Window indices known at compile time (nt is unrolled; 2t + (e & 1) < 8), so the windows
            // stay in registers: key jj = j - tile_start is in column window nt / 8 and distance
            // window 1 - nt / 8.
            const int half = nt / 8, bit = (j - tile_start) & 63;
            visible = visible && (((keep_col[half] >> bit) & 1u) != 0 ||
                                  ((keep_dist[e >= 2 ? 1 : 0][1 - half] >> (63 - bit)) & 1u) != 0);
          }
          if (!visible) s[nt][e] = kNegInf;
        }
      }
    } else if (sparse) {
      // An interior tile of a sparse run: the kept-key bits alone.
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = nt / 8, bit = (nt * 8 + 2 * t + (e & 1)) & 63;
          const bool kept = ((keep_col[half] >> bit) & 1u) != 0 ||
                            ((keep_dist[e >= 2 ? 1 : 0][1 - half] >> (63 - bit)) & 1u) != 0;
          if (!kept) s[nt][e] = kNegInf;
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) online_softmax_row(s, rr, unit, m[rr], l[rr], o);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pf[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pf[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pf[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  }
  if (num_tiles > 0) {
    const int last = num_tiles - 1;
    mbarrier_wait(&bar.full_v[last % kStages], (last / kStages) & 1);
    fence_proxy_async();
    const uint32_t v_addr = smem_address(v_ring + (last % kStages) * L::kVTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      wgmma_rs_mn<DV, T>(o, pf[kk], wgmma_desc(v_addr + kk * 16 * 128, kKeys * 128));
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pf);
  }
  // Warpgroup 1 arrived once more on warpgroup 0's turn than warpgroup 0 waited.
  if (wg == 0) named_barrier_sync(1, kConsumerThreads);

  store_prefill_rows<DV>(p, o, m, l, row_base, rows_valid, t, head, q_start + q_tile);
}

// Ragged K or V ([rows, heads, width]) as the producer's TMA boxes: 64 columns x 1 head x 128 rows.
template <typename T>
CUtensorMap ragged_map(const void* base, int width, int heads, int64_t rows, const char* what) {
  const uint64_t dims[3] = {static_cast<uint64_t>(width), static_cast<uint64_t>(heads), static_cast<uint64_t>(rows)};
  const uint64_t strides[2] = {static_cast<uint64_t>(width) * 2, static_cast<uint64_t>(width) * 2 * heads};
  const uint32_t box[3] = {64, 1, kKeys};
  return swizzled_tensor_map(base, std::is_same_v<T, __nv_bfloat16>, 3, dims, strides, box, what);
}

template <typename T, int DK, int DV>
void launch_typed(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  constexpr size_t smem = Layout<DK, DV>::kSmemBytes;
  raise_dynamic_smem(prefill_wgmma_kernel<T, DK, DV>, smem);
  CUtensorMap k_map{};
  CUtensorMap v_map{};
  if (p.kv_row_start != nullptr) {
    SPECULA_REQUIRE(p.num_kv_rows > 0 && p.num_kv_rows <= INT32_MAX,
                    "prefill over ragged K/V: num_kv_rows " + std::to_string(p.num_kv_rows) +
                        " must be in 1 .. 2^31 - 1 (the rows k_cache and v_cache hold)");
    k_map = ragged_map<T>(p.k_cache, DK, p.num_kv_heads, p.num_kv_rows, "ragged K");
    v_map = ragged_map<T>(p.v_cache, DV, p.num_kv_heads, p.num_kv_rows, "ragged V");
  }
  const dim3 grid(static_cast<unsigned>(work.num_items) * static_cast<unsigned>(p.num_q_heads));
  launch_pdl(prefill_wgmma_kernel<T, DK, DV>, grid, kThreads, smem, stream, p, work, k_map, v_map);
}

template <typename T>
void launch_dim(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  if (p.head_dim == 64) {
    launch_typed<T, 64, 64>(p, work, stream);
  } else {
    launch_typed<T, 128, 128>(p, work, stream);
  }
}

}  // namespace

bool prefill_wgmma_supports(const AttentionParams& p) {
  if (p.kv_dtype != p.io_dtype) return false;
  if (p.head_dim == 192) return p.v_head_dim == 128 && p.io_dtype == kBF16;
  return (p.head_dim == 64 || p.head_dim == 128) && p.v_head_dim == p.head_dim;
}

int prefill_head_group(int64_t kv_bytes_per_kv_head, int num_q_heads, int num_kv_heads, int64_t l2_bytes) {
  const int64_t per_head = std::max<int64_t>(kv_bytes_per_kv_head, 1);
  if (per_head * num_kv_heads <= l2_bytes) return num_q_heads;
  const int64_t kv_heads = std::clamp<int64_t>(l2_bytes / 2 / per_head, 1, num_kv_heads);
  return static_cast<int>(kv_heads) * (num_q_heads / num_kv_heads);
}

void launch_prefill_wgmma(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  SPECULA_REQUIRE(prefill_wgmma_supports(p),
                  "prefill_wgmma: head_dim " + std::to_string(p.head_dim) + " / v_head_dim " +
                      std::to_string(p.v_head_dim) + ", query dtype code " + std::to_string(p.io_dtype) +
                      ", KV dtype code " + std::to_string(p.kv_dtype) + " is not a case it is built for");
  if (work.num_items == 0) return;  // an empty grid is not a valid launch
  if (p.head_dim == 192) {
    launch_typed<__nv_bfloat16, 192, 128>(p, work, stream);
  } else if (p.io_dtype == kBF16) {
    launch_dim<__nv_bfloat16>(p, work, stream);
  } else {
    launch_dim<__half>(p, work, stream);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
