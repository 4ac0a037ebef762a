// Split-KV decode (flash-decoding) over a paged KV cache, on tensor cores.
//
// Grid: (num_kv_heads x head_blocks, num_splits, num_seqs) (decode_block.cuh). A block serves up
// to 8 query heads of one KV head over one key range; they are the 8 columns of mma.sync m16n8k16
// with the tile transposed (keys or head dimensions as rows), so each K/V row is read once for all
// of them. 4 warps, or kDecodeWideWarps when the plan puts one block per multiprocessor (few head
// groups, many splits); each streams its own 16-key tiles (tiles w, w + warps, ...) through a
// kStages-deep cp.async pipeline in its own shared-memory region, so the main loop has no block
// barrier and the bytes in flight do not depend on registers (a scalar kernel that kept its loads
// in registers had 16 KB per block in flight and reached 49% of the copy rate). Per tile:
// S^T = K Q^T (D/16 mma), online softmax across the lanes of each column, O^T += V^T P^T (D/16
// mma). The warps' states merge at the end; with several splits the last block of a head group
// merges the splits.
#include <type_traits>

#include "specula/core/convert.cuh"
#include "specula/attention/cuda/kernels/decode_block.cuh"
#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kKeys = 16;  // keys per warp tile
constexpr float kNegInf = -__builtin_huge_valf();

// kWords 32-bit words from shared memory 4 * kWords-byte aligned, in the widest loads that allows.
template <int kWords>
__device__ __forceinline__ void load_words(const void* src, uint32_t (&w)[kWords]) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 4) {
      const uint4 v = reinterpret_cast<const uint4*>(src)[i / 4];
      w[i] = v.x;
      w[i + 1] = v.y;
      w[i + 2] = v.z;
      w[i + 3] = v.w;
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 2) {
      const uint2 v = reinterpret_cast<const uint2*>(src)[i / 2];
      w[i] = v.x;
      w[i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = reinterpret_cast<const uint32_t*>(src)[i];
  }
}

// Q: the query's type; KV: the cache's; T: the MMA operand type. A 16-bit cache is the operand
// type and is copied straight into operand tiles; a query of the other 16-bit type is converted
// (a bf16 query into an f16 cache's type is exact within f16's range; an f16 query into a bf16
// cache's type keeps 8 significant bits, where prefill converts the cache instead). An fp8 cache
// is staged raw and multiplied in f16, into which every e4m3 value converts exactly with one
// paired instruction (bf16 would take three more; a bf16 query converts exactly within f16's
// range, as for an f16 cache): each lane converts its K fragments straight from the staged
// bytes in registers (kConvert below), and its V fragments too in wide blocks (kVRegs), where
// 4-warp blocks convert each tile's V into a per-warp operand tile that ldmatrix transposes.
template <typename T, typename KV, int D, int kWarps>
struct Shape {
  static constexpr bool kConvert = sizeof(KV) == 1;
  static_assert(!kConvert || std::is_same_v<T, __half>, "fp8 caches are multiplied in f16");
  // fp8 V fragments straight from the staged bytes too, in wide blocks (B=1 L=32768 on the H200:
  // 0.034 against 0.036 ms) whose lanes' shares of a row are whole 32-bit words (head_dim a
  // multiple of 32). 4-warp blocks convert V into an operand tile: held to 128 registers for four
  // blocks per multiprocessor they spilled with V in registers and were slower (B=256 L=1024:
  // 0.176 against 0.165 ms); with the transposed tiles they no longer spill but measured the same
  // (0.151-0.152 ms either way).
  static constexpr bool kVRegs = kConvert && D % 32 == 0 && kWarps == kDecodeWideWarps;
  static constexpr int kStride = D + 8;  // operand rows, padded: ldmatrix stays conflict-free
  static constexpr int kRawStride = kConvert ? D + 16 : kStride;  // staged rows, in KV elements
  // fp8: two, so that four 4-warp blocks fit on a multiprocessor (kDecodeMinBlocks).
  static constexpr int kStages = D <= 128 ? (kConvert ? 2 : 3) : 2;
  static constexpr int kRawTile = kKeys * kRawStride;  // elements of one staged K or V tile
  static constexpr size_t kWarpRawBytes = sizeof(KV) * kStages * 2 * kRawTile;  // [stage][K, V]
  static constexpr size_t kWarpOperandBytes = kConvert && !kVRegs ? sizeof(T) * kKeys * kStride : 0;  // V
  static constexpr size_t kPipeBytes = kWarps * (kWarpRawBytes + kWarpOperandBytes);
  // The warps' merge: m, l, the parts' weights, each head's LSE and 1 / l, then O's rows padded so
  // that the lanes of a column (heads 2t, 2t + 1 of dimension g) store to distinct banks.
  static constexpr int kMergeStride = D + 4;
  static constexpr size_t kMergeBytes =
      sizeof(float) * (kWarps * kDecodeHeadsPerBlock * (3 + kMergeStride) + 2 * kDecodeHeadsPerBlock);
  static constexpr size_t kSmemBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
};

// fp8 4-warp blocks up to head_dim 128 take 53 KB of shared memory, so four fit on a
// multiprocessor if each thread keeps to 128 registers: a batch of 64 sequences x 8 KV heads (512
// blocks) then runs in one wave instead of a full one and a third (H200, B=64 L=4096: 0.157
// against 0.211 ms when it was bought with 20 bytes of spills; the transposed tiles need 126
// registers at head_dim 128 and spill nothing).
template <typename KV, int D, int kWarps>
constexpr int kDecodeMinBlocks = sizeof(KV) == 1 && kWarps == 4 && D <= 128 ? 4 : 1;

template <typename Q, typename T, typename KV, int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, kDecodeMinBlocks<KV, D, kWarps>)
    decode_kernel(const AttentionParams p, const DecodeSplit split) {
  using S = Shape<T, KV, D, kWarps>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  KV* pipe = reinterpret_cast<KV*>(smem_raw + warp * S::kWarpRawBytes);
  T* operand = reinterpret_cast<T*>(smem_raw + kWarps * S::kWarpRawBytes + warp * S::kWarpOperandBytes);

  const DecodeBlock b = decode_block(p, split, kDecodeHeadsPerBlock);
  const int32_t* pages = p.page_table + static_cast<int64_t>(b.seq) * p.page_table_stride;
  const KV* k_cache = static_cast<const KV*>(p.k_cache);
  const KV* v_cache = static_cast<const KV*>(p.v_cache);
  const int num_tiles = b.begin < b.end ? (b.end - b.begin + kKeys - 1) / kKeys : 0;
  const int my_tiles = warp < num_tiles ? (num_tiles - warp + kWarps - 1) / kWarps : 0;

  // Copies ask the L2 for whole 128-byte lines (the 16 lanes' chunks of a row then make one memory
  // request per line, not one per sector), and mark them first to go: KV is read once, and the
  // split partials written meanwhile stay in the L2 for the block that merges them. Fetching 256
  // bytes gained nothing for bf16 and cost fp8 B=1; L2 prefetches of the next tiles (bulk or per
  // line) cost 10-20 points of copy rate (docs/PERFORMANCE.md).
  const uint64_t kv_policy = l2_evict_first();

  // Lane r < 16 loads the page-table entry of key r of a tile (-1 past the range) kPageAhead tiles
  // before the tile's copy, and turns it into a cache row only as the copy is issued; every lane
  // then copies chunks of all 16 rows. Computing the row next to the load (inside its branch)
  // made the warp wait for the entry right there each tile, a round trip to the L2 through a
  // saturated memory system (B=1 L=32768 on the H200: 23% of ncu's stall samples on that one
  // multiply). Page sizes are powers of two (the backend checks), so a key's page is a shift away.
  constexpr int kPageAhead = 2;
  const int page_shift = __ffs(p.page_size) - 1;
  auto key_of = [&](int i) { return b.begin + (warp + i * kWarps) * kKeys + (lane & 15); };
  auto tile_page = [&](int i) -> int32_t {
    const int j = key_of(i);
    return i < my_tiles && j < b.end ? pages[j >> page_shift] : -1;
  };
  auto load_tile = [&](int i, int32_t page) {
    const int32_t row =
        page < 0 ? -1 : ((page << page_shift) + (key_of(i) & (p.page_size - 1))) * p.num_kv_heads + b.kv_head;
    KV* k_dst = pipe + (i % S::kStages) * 2 * S::kRawTile;
    KV* v_dst = k_dst + S::kRawTile;
    constexpr int kPerRow = 16 / static_cast<int>(sizeof(KV));  // elements per chunk
    constexpr int kChunks = D * static_cast<int>(sizeof(KV)) / 16;  // 16-byte chunks per row
#pragma unroll
    for (int it = 0; it < (kKeys * kChunks + 31) / 32; ++it) {
      const int c = lane + 32 * it;
      const int r = c / kChunks;
      const int ch = c % kChunks;
      const int32_t src_row = __shfl_sync(0xffffffffu, row, r & (kKeys - 1));
      if (r < kKeys) {
        const int64_t offset = static_cast<int64_t>(src_row < 0 ? 0 : src_row) * D + ch * kPerRow;
        cp_async_16_stream(k_dst + r * S::kRawStride + ch * kPerRow, k_cache + offset, src_row >= 0, kv_policy);
        cp_async_16_stream(v_dst + r * S::kRawStride + ch * kPerRow, v_cache + offset, src_row >= 0, kv_policy);
      }
    }
  };

  // The first tiles' page-table reads all go out before any copy waits on one: a cold start
  // then costs one page-table latency, not one per stage.
  int32_t first_pages[S::kStages - 1 + kPageAhead];
#pragma unroll
  for (int i = 0; i < S::kStages - 1 + kPageAhead; ++i) first_pages[i] = tile_page(i);
  auto first_copies = [&] {
#pragma unroll
    for (int i = 0; i < S::kStages - 1; ++i) {
      if (i < my_tiles) load_tile(i, first_pages[i]);
      cp_async_commit();
    }
  };
  // Everything above reads step metadata, written before the step's first kernel. The kernel just
  // before this one (the layer's set_kv_buffer, or the model's fused q/k/v epilogue) writes Q and
  // the step's new key, the sequence's last, and nothing else this kernel reads; pdl_wait waits
  // for that kernel, and every kernel triggers its dependent only after its own wait, so the ones
  // before it have finished. A warp whose first tiles end before the new key (a warp-uniform
  // test) therefore issues their copies before the wait, under the previous kernel's tail: B=1
  // L=32768 in eight back-to-back layers went from 80-81% to 84-86% of the copy rate (H200).
  const bool copy_early = b.begin + (warp + (S::kStages - 2) * kWarps + 1) * kKeys < b.kv_len;
  if (copy_early) first_copies();
  pdl_wait();
  pdl_trigger();
  if (!copy_early) first_copies();
  int32_t next_pages[kPageAhead];  // of tiles i + kStages - 1, i + kStages, ... at iteration i
#pragma unroll
  for (int k = 0; k < kPageAhead; ++k) next_pages[k] = first_pages[S::kStages - 1 + k];

  // Each tile is multiplied transposed, S^T = K Q^T and O^T += V^T P^T: keys and head dimensions
  // fill the 16 rows of mma.sync m16n8k16 and the block's 8 query heads its 8 columns, so no
  // multiply spends half its rows on heads that do not exist (with Q as the A operand rows 8-15
  // were zero: twice the multiplies, and O held twice the registers). Q is the B operand, straight
  // from global memory while the first tiles are in flight (column g < num_heads; others zero).
  //
  // Dual chunk attention: each head's three rotary variants lie head_dim apart, and a key's chunk
  // picks the one its logit uses (its own chunk: intra; the one before: successive; earlier:
  // inter). Tiles start at multiples of 16 keys and chunks are multiples of 16 long, so a tile
  // lies in one chunk; a warp's tiles go up in key order, so it loads Q at most three times.
  uint32_t q_b[D / 16][2];
  const bool valid_head = g < b.num_heads;
  // An fp8 tile's K fragments come in the head-dimension order of its staged bytes (below), so
  // lane t takes dims 16 ks + 4 t .. + 3 of Q for mma k = 2t, 2t + 1, 2t + 8, 2t + 9.
  const Q* q_lane = static_cast<const Q*>(p.q) + b.token * p.q_stride_token +
                    static_cast<int64_t>(b.head0 + (valid_head ? g : 0)) * p.q_stride_head + (S::kConvert ? 4 : 2) * t;
  auto load_q = [&](int variant) {
    const Q* q = q_lane + variant * D;
    auto pair = [&](const Q* src) -> uint32_t {
      if (!valid_head) return 0u;
      const uint32_t raw = __ldg(reinterpret_cast<const unsigned int*>(src));
      if constexpr (std::is_same_v<Q, T>) {
        return raw;
      } else {
        const Q* v = reinterpret_cast<const Q*>(&raw);
        return pack2<T>(to_float(v[0]), to_float(v[1]));
      }
    };
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      q_b[ks][0] = pair(q + ks * 16);
      q_b[ks][1] = pair(q + ks * 16 + (S::kConvert ? 2 : 8));
    }
  };
  const int dca_len = p.dca_chunk_len;
  const int q_chunk = dca_len > 0 ? (b.kv_len - 1) / dca_len : 0;
  auto variant_of = [&](int key) {
    const int c = key / dca_len;
    return c == q_chunk ? 0 : c + 1 == q_chunk ? 1 : 2;
  };
  int q_variant = dca_len > 0 && my_tiles > 0 ? variant_of(b.begin + warp * kKeys) : 0;
  load_q(q_variant);

  // O^T: row r of m-tile j is head dimension 16 j + r (kVRegs: (r % 8) * D / 8 + 2 j + r / 8,
  // below), columns are query heads; m and l are those of heads 2t and 2t + 1.
  float o[D / 16][4];
#pragma unroll
  for (int j = 0; j < D / 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.0f, 0.0f};
  float score_mul = p.scale * p.k_descale;
  if (dca_len > 0 && p.dca_original_max_position > 0) {
    score_mul *= fmaxf(1.0f, 0.1f * logf(static_cast<float>(b.kv_len) / p.dca_original_max_position) + 1.0f);
  }
  const bool capped = p.logit_cap > 0.0f;

  const bool ticketing = split.num_splits > 1 && threadIdx.x == 0;
  uint32_t ticket = 0;
  for (int i = 0; i < my_tiles; ++i) {
    if (ticketing && i + 1 == my_tiles) ticket = take_split_ticket(split, b);
    if (i + S::kStages - 1 < my_tiles) load_tile(i + S::kStages - 1, next_pages[0]);
    cp_async_commit();
#pragma unroll
    for (int k = 0; k + 1 < kPageAhead; ++k) next_pages[k] = next_pages[k + 1];
    next_pages[kPageAhead - 1] = tile_page(i + S::kStages - 1 + kPageAhead);
    cp_async_wait<S::kStages - 1>();
    __syncwarp();
    const int tile_start = b.begin + (warp + i * kWarps) * kKeys;
    if (dca_len > 0) {
      const int variant = variant_of(tile_start);
      if (variant != q_variant) {
        q_variant = variant;
        load_q(variant);
      }
    }
    const KV* k_raw = pipe + (i % S::kStages) * 2 * S::kRawTile;
    const KV* v_raw = k_raw + S::kRawTile;
    float s[4] = {};  // S^T: keys g, g + 8 (rows) of heads 2t, 2t + 1
    const T* v_tile;
    if constexpr (S::kConvert) {
      if constexpr (!S::kVRegs) {
#pragma unroll
        for (int it = 0; it < 2 * D / 32; ++it) {  // 16 rows x D / 8 chunks of eight elements
          const int c = lane + 32 * it;
          const int r = c / (D / 8);
          const int col = (c % (D / 8)) * 8;
          *reinterpret_cast<uint4*>(operand + r * S::kStride + col) =
              fp8x8_to_half8(*reinterpret_cast<const uint2*>(v_raw + r * S::kRawStride + col));
        }
        v_tile = operand;
      }
      // S^T: the A fragment of keys g and 8 + g, mma k = 2t, 2t + 1, 2t + 8, 2t + 9 taken from the
      // four staged bytes 16 ks + 4 t .. + 3 of the key's row: one 32-bit load and two conversions
      // per key. Rows are D + 16 bytes apart, so the lanes' words fall in distinct banks (except
      // head_dim 80, two-way).
      const auto* k0 = reinterpret_cast<const uint32_t*>(k_raw + g * S::kRawStride) + t;
      const auto* k1 = reinterpret_cast<const uint32_t*>(k_raw + (8 + g) * S::kRawStride) + t;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t lo[2], hi[2];
        fp8x4_to_half2x2(k0[4 * ks], lo);
        fp8x4_to_half2x2(k1[4 * ks], hi);
        const uint32_t a[4] = {lo[0], hi[0], lo[1], hi[1]};
        mma_16816<T>(s, a, q_b[ks][0], q_b[ks][1]);
      }
      if constexpr (!S::kVRegs) __syncwarp();  // V's operand tile is whole before ldmatrix reads it
    } else {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, k_raw + ((lane & 7) + ((lane >> 3) & 1) * 8) * S::kStride + ks * 16 + (lane >> 4) * 8);
        mma_16816<T>(s, a, q_b[ks][0], q_b[ks][1]);
      }
      v_tile = v_raw;
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool visible = tile_start + g + 8 * r < b.end;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = s[2 * r + e] * score_mul;
        if (capped) v = p.logit_cap * tanhf(v / p.logit_cap);
        s[2 * r + e] = visible ? v * kLog2e : kNegInf;
      }
    }
    online_softmax_cols(s, m, l, o);

    // P^T as the B operand: each 8-key half of the C fragment, transposed in registers.
    const uint32_t p0 = movmatrix_trans(pack2<T>(s[0], s[1]));
    const uint32_t p1 = movmatrix_trans(pack2<T>(s[2], s[3]));
    if constexpr (S::kVRegs) {
      // The A fragment of m-tile j holds one dimension per row half for keys (2t, 2t + 1) and
      // (2t + 8, 2t + 9). Lane g takes dimensions g * D / 8 + 2 j (row g) and + 1 (row g + 8), so
      // its share of each of the four rows is D / 8 consecutive bytes (O's rows are put back in
      // order at the end), and a byte permute pairs the two keys of each dimension for the paired
      // conversion.
      constexpr int kWords = D / 32;
      uint32_t v01[2][kWords], v89[2][kWords];
      load_words(v_raw + (2 * t) * S::kRawStride + g * (D / 8), v01[0]);
      load_words(v_raw + (2 * t + 1) * S::kRawStride + g * (D / 8), v01[1]);
      load_words(v_raw + (2 * t + 8) * S::kRawStride + g * (D / 8), v89[0]);
      load_words(v_raw + (2 * t + 9) * S::kRawStride + g * (D / 8), v89[1]);
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        uint32_t lo[2], hi[2], lo8[2], hi8[2];
        fp8x4_to_half2x2(__byte_perm(v01[0][w], v01[1][w], 0x5140), lo);  // dims 4w, 4w + 1
        fp8x4_to_half2x2(__byte_perm(v01[0][w], v01[1][w], 0x7362), hi);  // dims 4w + 2, 4w + 3
        fp8x4_to_half2x2(__byte_perm(v89[0][w], v89[1][w], 0x5140), lo8);
        fp8x4_to_half2x2(__byte_perm(v89[0][w], v89[1][w], 0x7362), hi8);
        const uint32_t a_lo[4] = {lo[0], lo[1], lo8[0], lo8[1]};
        const uint32_t a_hi[4] = {hi[0], hi[1], hi8[0], hi8[1]};
        mma_16816<T>(o[2 * w], a_lo, p0, p1);
        mma_16816<T>(o[2 * w + 1], a_hi, p0, p1);
      }
    } else {
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, v_tile + ((lane & 7) + (lane >> 4) * 8) * S::kStride + j * 16 + ((lane >> 3) & 1) * 8);
        mma_16816<T>(o[j], a, p0, p1);
      }
    }
    __syncwarp();  // the next iteration's copy refills this stage
  }
  if (ticketing && my_tiles == 0) ticket = take_split_ticket(split, b);
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the merge area

  float* sm_m = reinterpret_cast<float*>(smem_raw);
  float* sm_l = sm_m + kWarps * kDecodeHeadsPerBlock;
  float* sm_w = sm_l + kWarps * kDecodeHeadsPerBlock;
  float* sm_o = sm_w + (kWarps + 2) * kDecodeHeadsPerBlock;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int lanes = 4; lanes < 32; lanes *= 2) l[e] += __shfl_xor_sync(0xffffffffu, l[e], lanes);
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int head = 2 * t + e;
    if (head < b.num_heads) {
      const int row = warp * kDecodeHeadsPerBlock + head;
      if (g == 0) {
        sm_m[row] = m[e];
        sm_l[row] = l[e];
      }
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int dim = S::kVRegs ? g * (D / 8) + 2 * j + r : 16 * j + 8 * r + g;
          sm_o[row * S::kMergeStride + dim] = o[j][2 * r + e];
        }
      }
    }
  }
  __syncthreads();
  finish_decode<kWarps>(p, split, b, sm_m, sm_l, sm_o, sm_w, kDecodeHeadsPerBlock, S::kMergeStride, ticket);
}

template <typename Q, typename T, typename KV, int D, int kWarps>
void launch_warps(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  constexpr size_t smem = Shape<T, KV, D, kWarps>::kSmemBytes;
  raise_dynamic_smem(decode_kernel<Q, T, KV, D, kWarps>, smem);
  const int group = p.num_q_heads / p.num_kv_heads;
  const int head_blocks = (group + kDecodeHeadsPerBlock - 1) / kDecodeHeadsPerBlock;
  const dim3 grid(p.num_kv_heads * head_blocks, split.num_splits, p.num_seqs);
  launch_pdl(decode_kernel<Q, T, KV, D, kWarps>, grid, kWarps * 32, smem, stream, p, split);
}

// A wide block whose pipeline does not fit in a multiprocessor's shared memory (head_dim 256 with
// 16-bit caches) runs as 4 warps: that kernel is alone on its multiprocessor too.
template <typename Q, typename T, typename KV, int D>
void launch_typed(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  constexpr size_t kMaxSmem = 227 * 1024;  // Hopper: the most dynamic shared memory one block may opt in to
  if constexpr (Shape<T, KV, D, kDecodeWideWarps>::kSmemBytes <= kMaxSmem) {
    if (split.warps == kDecodeWideWarps) {
      launch_warps<Q, T, KV, D, kDecodeWideWarps>(p, split, stream);
      return;
    }
  }
  launch_warps<Q, T, KV, D, 4>(p, split, stream);
}

template <typename Q, typename T, typename KV>
bool launch_dim(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: launch_typed<Q, T, KV, 64>(p, split, stream); return true;
    case 80: launch_typed<Q, T, KV, 80>(p, split, stream); return true;
    case 96: launch_typed<Q, T, KV, 96>(p, split, stream); return true;
    case 128: launch_typed<Q, T, KV, 128>(p, split, stream); return true;
    case 256: launch_typed<Q, T, KV, 256>(p, split, stream); return true;
    default: return false;
  }
}

template <typename Q>
bool launch_kv(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  switch (p.kv_dtype) {
    case kBF16: return launch_dim<Q, __nv_bfloat16, __nv_bfloat16>(p, split, stream);
    case kF16: return launch_dim<Q, __half, __half>(p, split, stream);
    case kFp8E4m3: return launch_dim<Q, __half, __nv_fp8_e4m3>(p, split, stream);
    default: return false;
  }
}

}  // namespace

void launch_decode(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  if (p.num_seqs == 0) return;
  SPECULA_REQUIRE(split.num_splits >= 1 && split.num_splits <= kMaxDecodeSplits,
                  "decode: " + std::to_string(split.num_splits) + " splits; allowed 1 to " +
                      std::to_string(kMaxDecodeSplits));
  SPECULA_REQUIRE(split.warps == 4 || split.warps == kDecodeWideWarps,
                  "decode: " + std::to_string(split.warps) + " warps per block; allowed 4 or " +
                      std::to_string(kDecodeWideWarps));
  SPECULA_REQUIRE(split.num_splits == 1 || (split.partial_out != nullptr && split.partial_lse != nullptr &&
                                            split.counters != nullptr),
                  "decode: " + std::to_string(split.num_splits) +
                      " splits need the partial-result and counter buffers");
  const bool launched = p.head_dim == p.v_head_dim &&
                        (p.io_dtype == kBF16 ? launch_kv<__nv_bfloat16>(p, split, stream)
                                             : p.io_dtype == kF16 && launch_kv<__half>(p, split, stream));
  SPECULA_REQUIRE(launched, "decode: head_dim " + std::to_string(p.head_dim) + " / v_head_dim " +
                                std::to_string(p.v_head_dim) + ", query dtype code " + std::to_string(p.io_dtype) +
                                ", KV dtype code " + std::to_string(p.kv_dtype) +
                                " are not supported (head_dim == v_head_dim in 64, 80, 96, 128, 256; bf16/f16 "
                                "queries; bf16/f16/fp8_e4m3 caches)");
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
