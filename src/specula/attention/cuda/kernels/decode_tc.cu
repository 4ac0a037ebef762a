// Split-KV decode on tensor cores, for 16-bit caches of the query's dtype.
//
// Grid and key splits as decode.cu (decode_block.cuh). A block serves up to 8 query heads of one
// KV head over one key range; they are rows 0-7 of mma.sync m16n8k16 (rows 8-15 stay zero and
// are never read back). 4 warps; each streams its own 16-key tiles (tiles w, w + 4, ...) through
// a kStages-deep cp.async pipeline in its own shared-memory region, so the main loop has no block
// barrier and the bytes in flight do not depend on registers: the scalar kernel kept 16 KB per
// block in flight and reached 49% of the copy rate. Per tile: S = Q K^T (D/16 x 2 mma), online
// softmax within each quad, O += P V (D/8 mma). The four warps' states merge at the end.
#include "specula/attention/cuda/kernels/convert.cuh"
#include "specula/attention/cuda/kernels/decode_block.cuh"
#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/cuda/kernels/online_softmax.cuh"
#include "specula/core/cuda_check.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 16;  // keys per warp tile
constexpr float kNegInf = -__builtin_huge_valf();

template <int D>
struct Shape {
  static constexpr int kStride = D + 8;  // padded rows keep ldmatrix conflict-free
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kStages = D <= 128 ? 3 : 2;
  static constexpr int kTileElems = kKeys * kStride;
  static constexpr int kWarpElems = kStages * 2 * kTileElems;  // [stage][K, V][key][kStride]
  static constexpr size_t kPipeBytes = 2u * kWarps * kWarpElems;
  static constexpr size_t kMergeBytes = sizeof(float) * kWarps * kDecodeHeadsPerBlock * (D + 2);
  static constexpr size_t kSmemBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) decode_tc_kernel(const AttentionParams p, const DecodeSplit split) {
  using S = Shape<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  T* pipe = reinterpret_cast<T*>(smem_raw) + warp * S::kWarpElems;

  const DecodeBlock b = decode_block(p, split, kDecodeHeadsPerBlock);
  const int32_t* pages = p.page_table + static_cast<int64_t>(b.seq) * p.page_table_stride;
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  const int num_tiles = b.begin < b.end ? (b.end - b.begin + kKeys - 1) / kKeys : 0;
  const int my_tiles = warp < num_tiles ? (num_tiles - warp + kWarps - 1) / kWarps : 0;

  // Lane r < 16 finds the cache row of key r of a tile (-1 past the range); every lane then
  // copies chunks of all 16 rows. Rows are looked up one tile ahead of their copy, so the page
  // table read's latency overlaps a tile's math instead of delaying the copy.
  auto tile_row = [&](int i) -> int64_t {
    const int j = b.begin + (warp + i * kWarps) * kKeys + (lane & 15);
    if (i >= my_tiles || j >= b.end) return -1;
    return (static_cast<int64_t>(pages[j / p.page_size]) * p.page_size + j % p.page_size) * p.num_kv_heads + b.kv_head;
  };
  auto load_tile = [&](int i, int64_t row) {
    T* k_dst = pipe + (i % S::kStages) * 2 * S::kTileElems;
    T* v_dst = k_dst + S::kTileElems;
#pragma unroll
    for (int it = 0; it < kKeys * S::kChunks / 32; ++it) {
      const int c = lane + 32 * it;
      const int r = c / S::kChunks;
      const int ch = c % S::kChunks;
      const int64_t src_row = __shfl_sync(0xffffffffu, row, r);
      const int64_t offset = (src_row < 0 ? 0 : src_row) * D + ch * 8;
      cp_async_16(k_dst + r * S::kStride + ch * 8, k_cache + offset, src_row >= 0);
      cp_async_16(v_dst + r * S::kStride + ch * 8, v_cache + offset, src_row >= 0);
    }
  };

#pragma unroll
  for (int i = 0; i < S::kStages - 1; ++i) {
    if (i < my_tiles) load_tile(i, tile_row(i));
    cp_async_commit();
  }
  int64_t next_row = tile_row(S::kStages - 1);

  // Q as the A operand straight from global memory (rows g < num_heads; rows 8-15 are zero),
  // while the first tiles are in flight.
  uint32_t q_frag[D / 16][4];
  {
    const bool valid = g < b.num_heads;
    const T* q = static_cast<const T*>(p.q) + b.token * p.q_stride_token +
                 static_cast<int64_t>(b.head0 + (valid ? g : 0)) * p.q_stride_head + 2 * t;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      q_frag[ks][0] = valid ? __ldg(reinterpret_cast<const unsigned int*>(q + ks * 16)) : 0u;
      q_frag[ks][2] = valid ? __ldg(reinterpret_cast<const unsigned int*>(q + ks * 16 + 8)) : 0u;
      q_frag[ks][1] = q_frag[ks][3] = 0u;
    }
  }

  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m = kNegInf;
  float l = 0.0f;
  const float score_mul = p.scale * p.k_descale;
  const bool capped = p.logit_cap > 0.0f;

  for (int i = 0; i < my_tiles; ++i) {
    if (i + S::kStages - 1 < my_tiles) load_tile(i + S::kStages - 1, next_row);
    cp_async_commit();
    next_row = tile_row(i + S::kStages);
    cp_async_wait<S::kStages - 1>();
    __syncwarp();
    const T* k_tile = pipe + (i % S::kStages) * 2 * S::kTileElems;
    const T* v_tile = k_tile + S::kTileElems;

    float s[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k_tile + ((lane & 7) + (lane >> 4) * 8) * S::kStride + ks * 16 + ((lane >> 3) & 1) * 8);
      mma_16816<T>(s[0], q_frag[ks], kb[0], kb[1]);
      mma_16816<T>(s[1], q_frag[ks], kb[2], kb[3]);
    }

    const int tile_start = b.begin + (warp + i * kWarps) * kKeys;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = s[nt][e] * score_mul;
        if (capped) v = p.logit_cap * tanhf(v / p.logit_cap);
        s[nt][e] = tile_start + nt * 8 + 2 * t + e < b.end ? v * kLog2e : kNegInf;
      }
    }
    online_softmax_row(s, 0, m, l, o);

    const uint32_t a[4] = {pack2<T>(s[0][0], s[0][1]), 0u, pack2<T>(s[1][0], s[1][1]), 0u};
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * S::kStride + np * 16 + (lane >> 4) * 8);
      mma_16816<T>(o[2 * np], a, vb[0], vb[1]);
      mma_16816<T>(o[2 * np + 1], a, vb[2], vb[3]);
    }
    __syncwarp();  // this stage is refilled kStages - 1 tiles from now
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the merge area

  float* sm_m = reinterpret_cast<float*>(smem_raw);
  float* sm_l = sm_m + kWarps * kDecodeHeadsPerBlock;
  float* sm_o = sm_l + kWarps * kDecodeHeadsPerBlock;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (g < b.num_heads) {
    const int row = warp * kDecodeHeadsPerBlock + g;
    if (t == 0) {
      sm_m[row] = m;
      sm_l[row] = l;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      sm_o[row * D + nt * 8 + 2 * t] = o[nt][0];
      sm_o[row * D + nt * 8 + 2 * t + 1] = o[nt][1];
    }
  }
  __syncthreads();
  finish_decode<kWarps>(p, split, b, sm_m, sm_l, sm_o, kDecodeHeadsPerBlock, D);
}

template <typename T, int D>
void launch_typed(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  constexpr size_t smem = Shape<D>::kSmemBytes;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(decode_tc_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int head_blocks = (group + kDecodeHeadsPerBlock - 1) / kDecodeHeadsPerBlock;
  const dim3 grid(p.num_kv_heads * head_blocks, split.num_splits, p.num_seqs);
  decode_tc_kernel<T, D><<<grid, kThreads, smem, stream>>>(p, split);
}

template <typename T>
bool launch_dim(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: launch_typed<T, 64>(p, split, stream); return true;
    case 80: launch_typed<T, 80>(p, split, stream); return true;
    case 96: launch_typed<T, 96>(p, split, stream); return true;
    case 128: launch_typed<T, 128>(p, split, stream); return true;
    case 256: launch_typed<T, 256>(p, split, stream); return true;
    default: return false;
  }
}

}  // namespace

bool launch_decode_tc(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  if (p.kv_dtype != p.io_dtype || p.head_dim != p.v_head_dim) return false;
  if (p.kv_dtype == kBF16) return launch_dim<__nv_bfloat16>(p, split, stream);
  if (p.kv_dtype == kF16) return launch_dim<__half>(p, split, stream);
  return false;
}

}  // namespace specula::cuda_kernels
