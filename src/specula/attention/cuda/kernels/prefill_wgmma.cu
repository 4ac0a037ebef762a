// Prefill / extend / verify attention on Hopper's warpgroup MMA, for caches of the query's 16-bit
// type at head_dim 64 and 128, and bf16 at query/key width 192 with value width 128 (MLA in the
// expanded form, over ragged K/V rows); prefill.cu serves the other cases on mma.sync.
//
// One block per (query head, work item of kPrefillTileRows = 128 query rows): two consumer
// warpgroups of 64 rows each and one producer warpgroup.
// - The producer gathers K/V tiles of 128 keys page by page with cp.async into a 3-stage ring of
//   128-byte-swizzled tiles; each stage's `full` mbarrier completes when its copies land, and its
//   `empty` mbarrier when both warpgroups are done reading it.
// - Each consumer warpgroup keeps S (64 x 128 scores), O (64 x head_dim) and the probabilities P
//   in registers. Per tile it issues, in one batch, O += P(previous tile) V(previous tile) and
//   S = Q K^T, then runs the masks and the online softmax on S while the tensor cores work.
// - The two warpgroups take turns issuing their batches (named barriers), so one's softmax runs
//   while the other's matrix products do: the tensor cores are not left idle during exp2.
#include "specula/attention/cuda/kernels/prefill_wgmma.h"

#include "specula/attention/cuda/kernels/convert.cuh"
#include "specula/attention/cuda/kernels/io.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"
#include "specula/attention/cuda/kernels/prefill_epilogue.cuh"
#include "specula/attention/cuda/kernels/wgmma.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr int kRows = kPrefillTileRows;
static_assert(kRows == 128, "two warpgroups of 64 query rows");
constexpr int kKeys = 128;
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

// DK: query/key width, DV: value width. As many stages of K and V tiles as fit beside Q (three at
// head_dim 64 and 128, two at 192 / 128).
template <int DK, int DV>
struct Layout {
  static constexpr int kChunks = DK / 8;                    // 16-byte chunks per Q row
  static constexpr int kQBytes = kRows * DK * 2;
  static constexpr int kKTileBytes = kKeys * DK * 2;
  static constexpr int kVTileBytes = kKeys * DV * 2;
  static constexpr int kStageBytes = kKTileBytes + kVTileBytes;
  static constexpr int kStages = (227 * 1024 - 1024 - kQBytes - 64) / kStageBytes < 3
                                     ? (227 * 1024 - 1024 - kQBytes - 64) / kStageBytes
                                     : 3;
  static_assert(kStages >= 2, "two stages of K/V tiles must fit beside Q");
  static constexpr size_t kSmemBytes = 1024 + kQBytes + kStages * kStageBytes + 2 * kStages * sizeof(uint64_t);
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

// The producer warpgroup: warp w copies rows 32 w .. 32 w + 31 of every K and V tile.
template <typename T, int DK, int DV>
__device__ void produce(const AttentionParams& p, const int32_t* pages, int64_t row_start, int kv_head, int kv_len,
                        int tile_first, int num_tiles, unsigned char* stages, uint64_t* full, uint64_t* empty) {
  using L = Layout<DK, DV>;
  constexpr int kStages = L::kStages;
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  const int lane = threadIdx.x & 31;
  const int row0 = 32 * ((threadIdx.x - kConsumerThreads) / 32);
  for (int i = 0; i < num_tiles; ++i) {
    const int stage = i % kStages;
    if (i >= kStages) mbarrier_wait(&empty[stage], ((i / kStages) - 1) & 1);
    // The cache slot (or ragged row) of key row0 + lane (-1 past the sequence), looked up once.
    const int j = (tile_first + i) * kKeys + row0 + lane;
    int32_t slot = -1;
    if (j < kv_len) {
      slot = pages != nullptr ? pages[j / p.page_size] * p.page_size + j % p.page_size
                              : static_cast<int32_t>(row_start + j);
    }
    unsigned char* k_tile = stages + stage * L::kStageBytes;
    unsigned char* v_tile = k_tile + L::kKTileBytes;
    if constexpr (DK == DV) {
      copy_tile_rows<DK, true>(k_tile, k_cache, v_tile, v_cache, slot, row0, p.num_kv_heads, kv_head);
    } else {
      copy_tile_rows<DK, false>(k_tile, k_cache, v_tile, v_cache, slot, row0, p.num_kv_heads, kv_head);
      copy_tile_rows<DV, false>(v_tile, v_cache, k_tile, k_cache, slot, row0, p.num_kv_heads, kv_head);
    }
    mbarrier_arrive_cp_async(&full[stage]);
  }
  cp_async_wait<0>();  // no copy may be in flight when this thread exits
}

template <typename T, int DK, int DV>
__global__ void __launch_bounds__(kThreads, 1) prefill_wgmma_kernel(const AttentionParams p, const PrefillWork work) {
  using L = Layout<DK, DV>;
  constexpr int kStages = L::kStages;
  pdl_wait();
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sQ = smem_raw + ((1024u - (smem_address(smem_raw) & 1023u)) & 1023u);
  unsigned char* stages = sQ + L::kQBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * L::kStageBytes);
  uint64_t* empty = full + kStages;

  // Blocks run heads fastest and items last to first: the last tiles of a causal sequence see the
  // most keys, and starting with them leaves the short ones to fill the tail.
  const int item = work.num_items - 1 - static_cast<int>(blockIdx.x / p.num_q_heads);
  const int seq = work.items[2 * item];
  const int q_tile = work.items[2 * item + 1];
  const int head = static_cast<int>(blockIdx.x % p.num_q_heads);
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
      mbarrier_init(&full[s], kProducerThreads);  // one cp.async arrival per producer thread
      mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
    }
  }
  __syncthreads();

  if (threadIdx.x >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    produce<T, DK, DV>(p, pages, row_start, kv_head, kv_len, tile_first, num_tiles, stages, full, empty);
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
  const float score_mul = p.scale * p.k_descale;
  const bool capped = p.logit_cap > 0.0f;
  const float cap_mul = capped ? score_mul / p.logit_cap : 0.0f;
  const float cap_log2 = p.logit_cap * kLog2e;
  const float unit = capped ? 1.0f : score_mul * kLog2e;  // raw score -> log2 units
  const int64_t mask_offset = custom ? p.mask_offsets[seq] : 0;
  const uint32_t q_addr = smem_address(sQ) + wg * 64 * 128;
  const int row_base = wg * 64 + warp * 16 + g;  // this thread's rows: row_base and row_base + 8

  for (int i = 0; i < num_tiles; ++i) {
    const int stage = i % kStages;
    const int prev = (i + kStages - 1) % kStages;
    mbarrier_wait(&full[stage], (i / kStages) & 1);
    fence_proxy_async();
    const uint32_t k_addr = smem_address(stages + stage * L::kStageBytes);
    named_barrier_sync(1 + wg, kConsumerThreads);
    wgmma_fence();
    if (i > 0) {
      const uint32_t v_addr = smem_address(stages + prev * L::kStageBytes + L::kKTileBytes);
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
    if (i > 0 && lane == 0) mbarrier_arrive(&empty[prev]);

    // Soft-cap (in log2 units) or leave the scale to the softmax; masks only on tiles that need
    // them, so the common tile runs without a branch per score.
    if (capped) {
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = cap_log2 * tanhf(s[nt][e] * cap_mul);
      }
    }
    const int tile_start = (tile_first + i) * kKeys;
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
          if (!visible) s[nt][e] = kNegInf;
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
    const uint32_t v_addr = smem_address(stages + ((num_tiles - 1) % kStages) * L::kStageBytes + L::kKTileBytes);
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

template <typename T, int DK, int DV>
void launch_typed(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  constexpr size_t smem = Layout<DK, DV>::kSmemBytes;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_kernel<T, DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(work.num_items) * static_cast<unsigned>(p.num_q_heads));
  launch_pdl(prefill_wgmma_kernel<T, DK, DV>, grid, kThreads, smem, stream, p, work);
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

void launch_prefill_wgmma(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  if (p.head_dim == 192) {
    launch_typed<__nv_bfloat16, 192, 128>(p, work, stream);
  } else if (p.io_dtype == kBF16) {
    launch_dim<__nv_bfloat16>(p, work, stream);
  } else {
    launch_dim<__half>(p, work, stream);
  }
}

}  // namespace specula::cuda_kernels
