// Prefill / extend / verify attention over a paged KV cache on tensor cores: the mma.sync kernel
// (FlashAttention-2 structure) for the cases the wgmma kernel (prefill_wgmma.cu) is not built for:
// fp8 or other-type caches, and head_dim 80, 96 and 256. The backend's selection function chooses;
// this kernel serves every paged case, so launch_prefill_mma checks only what it cannot do.
//
// Grid: (work items, num_q_heads); 256 threads = 8 warps, each owning 16 of the tile's 128
// query rows. Per K/V tile of kKeys keys: S = Q K^T in registers, scale / soft-cap / masks, online
// softmax in log2 units, P (rounded to the operand type) times V accumulated in registers.
// K/V tiles are gathered page by page into padded shared-memory rows (row stride head_dim + 8
// elements keeps ldmatrix conflict-free), double-buffered with cp.async when the cache has the
// operand type, converted on the way in otherwise (fp8: exactly, the descales are folded into
// the score scale and the output).
#include <type_traits>

#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/core/convert.cuh"
#include "specula/attention/cuda/kernels/io.cuh"
#include "specula/attention/cuda/kernels/keep_bits.cuh"
#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"
#include "specula/attention/cuda/kernels/prefill_epilogue.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"

namespace specula::cuda_kernels {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();
// 16 query rows per warp; kPrefillTileRows / 16 warps share each K/V tile.
constexpr int kThreads = kPrefillTileRows * 2;

template <typename T, typename KV, int D>
struct Traits {
  static constexpr int kRows = kPrefillTileRows;
  static constexpr int kKeys = D <= 128 ? 64 : 32;
  static constexpr int kStride = D + 8;
  static constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  static constexpr bool kDirect = std::is_same_v<T, KV>;
  static constexpr size_t kSmemBytes = sizeof(T) * static_cast<size_t>(kStride) * (kRows + 4 * kKeys);
  // Q fragments live in registers for head_dim <= 128 (D / 4 registers); wider heads re-read
  // them from shared memory each tile to stay clear of spills.
  static constexpr bool kQInRegisters = D <= 128;
};

// Eight cache elements -> eight operand elements packed in 16 bytes (conversion path).
template <typename T, typename KV>
__device__ __forceinline__ uint4 load_convert8(const KV* src) {
  float f[8];
  if constexpr (sizeof(KV) == 1) {
    fp8x8_to_float(*reinterpret_cast<const uint2*>(src), f);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = to_float(src[i]);
  }
  return make_uint4(pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]), pack2<T>(f[6], f[7]));
}

template <typename T, typename KV, int D>
struct Prefill {
  using Tr = Traits<T, KV, D>;
  static constexpr int kRows = Tr::kRows;
  static constexpr int kKeys = Tr::kKeys;
  static_assert(kKeys <= 64, "the dual chunk keep windows (bits64) cover 64 keys of a tile");
  static constexpr int kStride = Tr::kStride;

  // Gathers keys [tile * kKeys, + kKeys) of one KV head into shared memory; rows past kv_len
  // are zero (a zero V row times a zero probability stays zero; garbage could be NaN).
  static __device__ void load_kv_tile(const AttentionParams& p, const int32_t* pages, int kv_head, int kv_len, int tile,
                                      T* sK, T* sV) {
    const KV* k_cache = static_cast<const KV*>(p.k_cache);
    const KV* v_cache = static_cast<const KV*>(p.v_cache);
    for (int c = threadIdx.x; c < kKeys * Tr::kChunks; c += kThreads) {
      const int r = c / Tr::kChunks;
      const int ch = c % Tr::kChunks;
      const int j = tile * kKeys + r;
      const bool valid = j < kv_len;
      const int64_t slot = valid ? static_cast<int64_t>(pages[j / p.page_size]) * p.page_size + j % p.page_size : 0;
      const int64_t offset = (slot * p.num_kv_heads + kv_head) * D + ch * 8;
      T* k_dst = sK + r * kStride + ch * 8;
      T* v_dst = sV + r * kStride + ch * 8;
      if constexpr (Tr::kDirect) {
        cp_async_16(k_dst, k_cache + offset, valid);
        cp_async_16(v_dst, v_cache + offset, valid);
      } else {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(k_dst) = valid ? load_convert8<T, KV>(k_cache + offset) : zero;
        *reinterpret_cast<uint4*>(v_dst) = valid ? load_convert8<T, KV>(v_cache + offset) : zero;
      }
    }
  }

  static __device__ void run(const AttentionParams& p, const PrefillWork& work) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sK = sQ + kRows * kStride;  // [2][kKeys][kStride]
    T* sV = sK + 2 * kKeys * kStride;

    const int seq = work.items[2 * blockIdx.x];
    const int q_tile = work.items[2 * blockIdx.x + 1];
    const int head = blockIdx.y;
    const int kv_head = head / (p.num_q_heads / p.num_kv_heads);
    const int q_start = p.cu_seqlens_q[seq];
    const int q_len = p.cu_seqlens_q[seq + 1] - q_start;
    const int kv_len = p.seq_lens_k[seq];
    const int q_kv_offset = kv_len - q_len;
    const int rows_valid = min(kRows, q_len - q_tile);
    const int pos_min = q_kv_offset + q_tile;
    const int pos_max = pos_min + rows_valid - 1;
    const bool custom = p.custom_mask != nullptr;
    const bool causal = p.causal && !custom;
    const int kv_end = causal ? min(kv_len, pos_max + 1) : kv_len;
    const int kv_begin = p.window_left >= 0 ? max(0, pos_min - p.window_left) : 0;
    const int tile_first = kv_begin / kKeys;
    const int tile_last = (kv_end + kKeys - 1) / kKeys;
    const int32_t* pages = p.page_table + static_cast<int64_t>(seq) * p.page_table_stride;
    const int64_t mask_offset = custom ? p.mask_offsets[seq] : 0;
    const int keep_run = p.keep_run != nullptr ? p.keep_run[seq] : -1;
    const bool sparse = keep_run >= 0;
    const int64_t keep_at = sparse ? (static_cast<int64_t>(keep_run) * p.num_q_heads + head) * p.keep_words : 0;
    const int key_base = sparse ? p.key_base[seq] : 0;
    const int q_base = sparse ? p.q_base[seq] : 0;

    // Q tile; rows past the sequence are zero.
    const T* q = static_cast<const T*>(p.q);
    for (int c = threadIdx.x; c < kRows * Tr::kChunks; c += kThreads) {
      const int r = c / Tr::kChunks;
      const int ch = c % Tr::kChunks;
      const bool valid = r < rows_valid;
      const T* src = q + static_cast<int64_t>(q_start + q_tile + (valid ? r : 0)) * p.q_stride_token +
                     static_cast<int64_t>(head) * p.q_stride_head + ch * 8;
      cp_async_16(sQ + r * kStride + ch * 8, src, valid);
    }
    if (tile_first < tile_last) load_kv_tile(p, pages, kv_head, kv_len, tile_first, sK, sV);
    cp_async_commit();

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {kNegInf, kNegInf};
    float l[2] = {0.0f, 0.0f};
    const float score_mul = p.scale * p.k_descale * (p.seq_score_scale != nullptr ? p.seq_score_scale[seq] : 1.0f);
    const bool capped = p.logit_cap > 0.0f;
    uint32_t q_frag[Tr::kQInRegisters ? D / 16 : 1][4];
    bool q_loaded = false;

    for (int tile = tile_first; tile < tile_last; ++tile) {
      const int buf = (tile - tile_first) & 1;
      if (tile + 1 < tile_last) {
        load_kv_tile(p, pages, kv_head, kv_len, tile + 1, sK + (buf ^ 1) * kKeys * kStride,
                     sV + (buf ^ 1) * kKeys * kStride);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      // Dual chunk sparse runs: the tile's kept columns, and per row of this thread the kept
      // distances of its keys (bit 63 - jj for key jj of the tile); a tile that keeps no key for
      // any row of the block is skipped (the same answer in every thread).
      uint64_t keep_col = 0, keep_dist[2] = {0, 0};
      if (sparse) {
        const int64_t key0 = static_cast<int64_t>(key_base) + tile * kKeys;
        keep_col = bits64(p.keep_cols + keep_at, p.keep_words, key0);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int qi = q_tile + warp * 16 + g + 8 * rr;
          keep_dist[rr] = bits64(p.keep_dists + keep_at, p.keep_words, q_base + qi - key0 - 63);
        }
        bool any = (keep_col & (kKeys == 64 ? ~uint64_t{0} : (uint64_t{1} << kKeys) - 1)) != 0;
        const int64_t dist_lo = q_base + q_tile - key0 - (kKeys - 1), dist_hi = q_base + q_tile + rows_valid - 1 - key0;
        for (int64_t d = dist_lo; d <= dist_hi && !any; d += 64) {
          const int64_t span = dist_hi - d + 1;
          const uint64_t b = bits64(p.keep_dists + keep_at, p.keep_words, d);
          any = (span >= 64 ? b : b & ((uint64_t{1} << span) - 1)) != 0;
        }
        if (!any) {
          __syncthreads();  // the buffer is refilled two tiles from now, as at the loop's end
          continue;
        }
      }
      const T* k_tile = sK + buf * kKeys * kStride;
      const T* v_tile = sV + buf * kKeys * kStride;
      if constexpr (Tr::kQInRegisters) {
        if (!q_loaded) {
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) {
            ldmatrix_x4(q_frag[ks], sQ + (warp * 16 + (lane & 15)) * kStride + ks * 16 + (lane >> 4) * 8);
          }
          q_loaded = true;
        }
      }

      // S = Q K^T for this warp's 16 rows.
      float s[kKeys / 8][4];
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a_smem[4];
        if constexpr (!Tr::kQInRegisters) {
          ldmatrix_x4(a_smem, sQ + (warp * 16 + (lane & 15)) * kStride + ks * 16 + (lane >> 4) * 8);
        }
        const uint32_t(&a)[4] = Tr::kQInRegisters ? q_frag[Tr::kQInRegisters ? ks : 0] : a_smem;
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, k_tile + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kStride + ks * 16 + ((lane >> 3) & 1) * 8);
          mma_16816<T>(s[2 * np], a, b[0], b[1]);
          mma_16816<T>(s[2 * np + 1], a, b[2], b[3]);
        }
      }

      // Scale, soft-cap, masks; to log2 units.
      const int tile_start = tile * kKeys;
      const bool need_mask = sparse || !(tile_start + kKeys <= kv_len && (!causal || tile_start + kKeys - 1 <= pos_min) &&
                                         (p.window_left < 0 || tile_start >= pos_max - p.window_left) && !custom);
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = s[nt][i] * score_mul;
          if (capped) v = p.logit_cap * tanhf(v / p.logit_cap);
          v *= kLog2e;
          if (need_mask) {
            const int qi = q_tile + warp * 16 + g + (i >= 2 ? 8 : 0);
            const int j = tile_start + nt * 8 + 2 * t + (i & 1);
            const int pos = q_kv_offset + qi;
            bool visible = j < kv_len && (!causal || j <= pos) && (p.window_left < 0 || j >= pos - p.window_left);
            if (custom && qi < q_len && j < kv_len) {
              visible = visible && p.custom_mask[mask_offset + static_cast<int64_t>(qi) * kv_len + j] != 0;
            }
            if (sparse) {
              const int jj = j - tile_start;
              visible = visible && (((keep_col >> jj) & 1u) != 0 || ((keep_dist[i >= 2 ? 1 : 0] >> (63 - jj)) & 1u) != 0);
            }
            if (!visible) v = kNegInf;
          }
          s[nt][i] = v;
        }
      }

      // Online softmax: this thread holds rows g and g + 8.
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) online_softmax_row(s, rr, 1.0f, m[rr], l[rr], o);

      // O += P V; the probabilities' C fragments are the A operand.
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                               pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + np * 16 + (lane >> 4) * 8);
          mma_16816<T>(o[2 * np], a, b[0], b[1]);
          mma_16816<T>(o[2 * np + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();  // the buffer just read is refilled two tiles from now
    }
    cp_async_wait<0>();  // no copy may still be in flight when the block retires

    store_prefill_rows<D>(p, o, m, l, warp * 16 + g, rows_valid, t, head, q_start + q_tile);
  }
};

template <typename T, typename KV, int D>
__global__ void __launch_bounds__(kThreads) prefill_kernel(const AttentionParams p, const PrefillWork work) {
  pdl_wait();
  pdl_trigger();
  Prefill<T, KV, D>::run(p, work);
}

template <typename T, typename KV, int D>
void launch_typed(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  constexpr size_t smem = Traits<T, KV, D>::kSmemBytes;
  raise_dynamic_smem(prefill_kernel<T, KV, D>, smem);
  const dim3 grid(static_cast<unsigned>(work.num_items), static_cast<unsigned>(p.num_q_heads));
  launch_pdl(prefill_kernel<T, KV, D>, grid, kThreads, smem, stream, p, work);
}

template <typename T, typename KV>
void launch_dim(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: launch_typed<T, KV, 64>(p, work, stream); break;
    case 80: launch_typed<T, KV, 80>(p, work, stream); break;
    case 96: launch_typed<T, KV, 96>(p, work, stream); break;
    case 128: launch_typed<T, KV, 128>(p, work, stream); break;
    case 256: launch_typed<T, KV, 256>(p, work, stream); break;
    default: SPECULA_REQUIRE(false, "prefill: head_dim " + std::to_string(p.head_dim) + " is not supported");
  }
}

template <typename T>
void launch_kv(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  switch (p.kv_dtype) {
    case kBF16: launch_dim<T, __nv_bfloat16>(p, work, stream); break;
    case kF16: launch_dim<T, __half>(p, work, stream); break;
    case kFp8E4m3: launch_dim<T, __nv_fp8_e4m3>(p, work, stream); break;
    default: SPECULA_REQUIRE(false, "prefill: KV dtype code " + std::to_string(p.kv_dtype) + " is not supported");
  }
}

}  // namespace

void launch_prefill_mma(const AttentionParams& p, const PrefillWork& work, cudaStream_t stream) {
  if (work.num_items == 0) return;
  SPECULA_REQUIRE(p.v_head_dim == p.head_dim, "prefill (mma.sync): v_head_dim " + std::to_string(p.v_head_dim) +
                                                  " differs from head_dim " + std::to_string(p.head_dim) +
                                                  "; only the wgmma kernel serves that (bf16 at 192 / 128)");
  SPECULA_REQUIRE(p.kv_row_start == nullptr && p.q_kv_offset == nullptr,
                  "prefill (mma.sync): ragged K/V rows and query offsets are served by the wgmma kernel only");
  if (p.io_dtype == kBF16) {
    launch_kv<__nv_bfloat16>(p, work, stream);
  } else {
    launch_kv<__half>(p, work, stream);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
