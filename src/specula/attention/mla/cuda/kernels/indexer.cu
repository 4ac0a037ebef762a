// The lightning indexer kernels (see indexer.h for the contract).
//
// scores: grid (token, 256-key chunk), 2 or 4 warps; warp w owns 16 heads (32 with 128 heads)
//   and every key of the tile. Per 64-key tile: cp.async the raw rows (fp8 values + f32 scale;
//   double-buffered, the next tile in flight while this one computes), convert fp8 -> bf16 into
//   a padded shared tile (exact), then S[h][j] = q[h] . k8[j] by mma m16n8k16 with the query's
//   A fragments held in registers for the whole block, B fragments by ldmatrix. The epilogue
//   forms w[h] * relu(S * scale_j) per fragment, sums the warp's heads with a butterfly
//   reduce-scatter (14 shuffles leave each lane two keys' sums), and sums warps in shared memory.
// select: one 1024-thread block per token runs block_topk.cuh's exact radix select on the
//   token's score row.
#include "specula/attention/mla/cuda/kernels/indexer.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>

#include "specula/core/convert.cuh"
#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/mla/cuda/kernels/block_topk.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_smem.h"

namespace specula::cuda_kernels {

namespace {

// ---- traits -------------------------------------------------------------------------------------

constexpr int kDim = kIndexerHeadDim;
constexpr int kRowBytes = kDim + 4;  // fp8 values, then the f32 scale
constexpr int kRowWords = kRowBytes / 4;
constexpr int kTileKeys = 64;
constexpr int kTilesPerBlock = 4;
constexpr int kBlockKeys = kTileKeys * kTilesPerBlock;
constexpr int kTileBytes = kTileKeys * kRowBytes;  // 8448 = 528 16-byte vectors
constexpr int kKeyStride = kDim + 8;  // bf16 per shared key row: 272 bytes, so ldmatrix rows hit distinct banks
constexpr int kKSteps = kDim / 16;
constexpr int kNTiles = kTileKeys / 8;
constexpr int kMaxScoreWarps = 4;
constexpr int kMaxGridY = 65535;
static_assert(kTileBytes % 16 == 0 && kRowBytes % 4 == 0);

struct ScoreSmem {
  alignas(16) uint8_t raw[2][kTileBytes];              // raw index rows of the tile (double-buffered)
  alignas(16) uint16_t keys[kTileKeys * kKeyStride];   // bf16 fp8 values of the tile, padded rows
  float red[kMaxScoreWarps][kTileKeys];                // per-warp head sums
};

// ---- device helpers: scores ---------------------------------------------------------------------

// 4-byte global -> shared copy; with valid == false nothing is read and zeros are written.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* global_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem_dst)), "l"(global_src),
               "r"(valid ? 4 : 0));
}

// Four fp8 e4m3 values (lowest byte first) -> four bf16, exactly: e4m3 values (normal and
// subnormal) are all representable in f16 and in bf16.
__device__ __forceinline__ uint2 fp8x4_to_bf16x4(uint32_t word) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
  const float2 flo = __half22float2(__half2(lo));
  const float2 fhi = __half22float2(__half2(hi));
  return make_uint2(pack2<__nv_bfloat16>(flo.x, flo.y), pack2<__nv_bfloat16>(fhi.x, fhi.y));
}

// Starts the copy of one tile's raw rows (keys [j0, j0 + 64)) into dst, as one cp.async group.
// contiguous: the tile is one run of slots inside a page (page_size % 64 == 0, j0 % 64 == 0), 16-byte
// aligned, copied whole; keys past last_key are stale but only feed their own (discarded) columns.
// Otherwise each key's row is found through the page table and copied in 4-byte words (rows are
// index_head_dim + 4 bytes, so only 4-byte aligned); keys past last_key are zero-filled.
__device__ __forceinline__ void issue_tile(const IndexerParams& p, const int32_t* pages, int j0, int last_key,
                                           bool contiguous, uint8_t* dst) {
  if (contiguous) {
    const int64_t slot0 = static_cast<int64_t>(pages[j0 / p.page_size]) * p.page_size + j0 % p.page_size;
    const uint8_t* src = p.index_cache + slot0 * kRowBytes;
    for (int c = threadIdx.x; c < kTileBytes / 16; c += blockDim.x) cp_async_16(dst + 16 * c, src + 16 * c, true);
  } else {
    for (int w = threadIdx.x; w < kTileKeys * kRowWords; w += blockDim.x) {
      const int key = w / kRowWords;
      const int word = w - key * kRowWords;
      const int j = j0 + key;
      const bool valid = j <= last_key;
      const uint8_t* src = p.index_cache;
      if (valid) {
        const int64_t slot = static_cast<int64_t>(pages[j / p.page_size]) * p.page_size + j % p.page_size;
        src += slot * kRowBytes + 4 * word;
      }
      cp_async_4(dst + key * kRowBytes + 4 * word, src, valid);
    }
  }
  cp_async_commit();
}

// One level: lanes split by the bit `kHalf * 2` of their index; each keeps kHalf of its values
// (upper lanes the upper half) and adds the partner's copy of them.
template <int kHalf>
__device__ __forceinline__ void reduce_scatter_level(float (&v)[16], int lane) {
  const bool upper = (lane & (2 * kHalf)) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * kHalf);
  }
}

// Sums v[16] (value i: key 8 * (i / 2) + 2 * t + i % 2 of the lane's fragment column t) over
// the eight lanes that share t, scattering the result: lane l ends with keys 2l and 2l + 1 in
// v[0], v[1]. Each level halves the values a lane keeps, so 8 + 4 + 2 shuffles instead of 48.
__device__ __forceinline__ void reduce_scatter_heads(float (&v)[16], int lane) {
  reduce_scatter_level<8>(v, lane);
  reduce_scatter_level<4>(v, lane);
  reduce_scatter_level<2>(v, lane);
}

// ---- kernels ------------------------------------------------------------------------------------

template <int kHeadTiles>  // 16-head MMA tiles per warp
__global__ void __launch_bounds__(kMaxScoreWarps * 32) indexer_scores_kernel(const IndexerParams p, int64_t stride,
                                                                            bool contiguous) {
  __shared__ ScoreSmem s;
  const int t = blockIdx.x;
  const int last_key = min(p.token_pos[t], p.max_kv_len - 1);  // the token scores keys [0, last_key]
  const int block_start = static_cast<int>(blockIdx.y) * kBlockKeys;
  if (block_start > last_key) return;
  const int num_tiles = (min(kBlockKeys, last_key + 1 - block_start) + kTileKeys - 1) / kTileKeys;
  const int32_t* pages = p.page_table + static_cast<int64_t>(p.token_req[t]) * p.max_pages;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int num_warps = blockDim.x >> 5;

  issue_tile(p, pages, block_start, last_key, contiguous, s.raw[0]);

  // The query's A fragments (rows = heads, cols = dims) and weights stay in registers.
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + static_cast<int64_t>(t) * p.n_heads * kDim;
  uint32_t a[kHeadTiles][kKSteps][4];
  float w_lo[kHeadTiles], w_hi[kHeadTiles];
#pragma unroll
  for (int mt = 0; mt < kHeadTiles; ++mt) {
    const int h = (warp * kHeadTiles + mt) * 16 + g;
    const uint16_t* r0 = q + h * kDim + 2 * tq;
    const uint16_t* r1 = r0 + 8 * kDim;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      a[mt][ks][0] = *reinterpret_cast<const uint32_t*>(r0 + ks * 16);
      a[mt][ks][1] = *reinterpret_cast<const uint32_t*>(r1 + ks * 16);
      a[mt][ks][2] = *reinterpret_cast<const uint32_t*>(r0 + ks * 16 + 8);
      a[mt][ks][3] = *reinterpret_cast<const uint32_t*>(r1 + ks * 16 + 8);
    }
    w_lo[mt] = p.weights[static_cast<int64_t>(t) * p.n_heads + h];
    w_hi[mt] = p.weights[static_cast<int64_t>(t) * p.n_heads + h + 8];
  }

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int j0 = block_start + tile * kTileKeys;
    const uint8_t* raw = s.raw[tile & 1];
    if (tile + 1 < num_tiles) {
      issue_tile(p, pages, j0 + kTileKeys, last_key, contiguous, s.raw[(tile + 1) & 1]);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // the tile's raw rows are visible to every thread

    for (int w = threadIdx.x; w < kTileKeys * (kDim / 4); w += blockDim.x) {
      const int key = w / (kDim / 4);
      const int group = w - key * (kDim / 4);
      const uint32_t word = *reinterpret_cast<const uint32_t*>(raw + key * kRowBytes + 4 * group);
      *reinterpret_cast<uint2*>(&s.keys[key * kKeyStride + 4 * group]) = fp8x4_to_bf16x4(word);
    }
    __syncthreads();

    float acc[kHeadTiles][kNTiles][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        // Matrices: (keys 16np + 0..7, dims lo), (same keys, dims hi), (keys 16np + 8..15, lo), (hi).
        const int m = lane >> 3;
        const int key = np * 16 + (m >> 1) * 8 + (lane & 7);
        const int col = ks * 16 + (m & 1) * 8;
        uint32_t b[4];
        ldmatrix_x4(b, &s.keys[key * kKeyStride + col]);
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt) {
          mma_16816<__nv_bfloat16>(acc[mt][2 * np], a[mt][ks], b[0], b[1]);
          mma_16816<__nv_bfloat16>(acc[mt][2 * np + 1], a[mt][ks], b[2], b[3]);
        }
      }
    }

    // relu(dot) = relu(acc * scale): the fp8 values were exact, the key's scale comes last.
    float v[16];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = nt * 8 + 2 * tq + c;
        const float scale = *reinterpret_cast<const float*>(raw + key * kRowBytes + kDim);
        float sum = 0.0f;
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt) {
          sum += w_lo[mt] * fmaxf(acc[mt][nt][c] * scale, 0.0f) + w_hi[mt] * fmaxf(acc[mt][nt][2 + c] * scale, 0.0f);
        }
        v[nt * 2 + c] = sum;
      }
    }
    reduce_scatter_heads(v, lane);
    *reinterpret_cast<float2*>(&s.red[warp][2 * lane]) = make_float2(v[0], v[1]);
    __syncthreads();
    if (threadIdx.x < kTileKeys && j0 + static_cast<int>(threadIdx.x) <= last_key) {
      float score = 0.0f;
      for (int w = 0; w < num_warps; ++w) score += s.red[w][threadIdx.x];
      p.scores[static_cast<int64_t>(t) * stride + j0 + threadIdx.x] = score;
    }
  }
}

__global__ void __launch_bounds__(block_topk::kThreads) indexer_select_kernel(const IndexerParams p, int64_t stride) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int t = blockIdx.x;
  const int n = min(p.token_pos[t] + 1, p.max_kv_len);  // run() treats n < 0 as 0
  block_topk::run(p.scores + static_cast<int64_t>(t) * stride, n, p.topk, smem,
                  p.out + static_cast<int64_t>(t) * p.topk);
}

// ---- host ---------------------------------------------------------------------------------------

void require_launchable(const IndexerParams& p, const IndexerConfig& c, bool scores, bool select) {
  SPECULA_REQUIRE(c.unsupported.empty(), c.unsupported);
  if (p.num_tokens == 0) return;
  SPECULA_REQUIRE(p.token_pos != nullptr && p.scores != nullptr,
                  "indexer: token_pos and the score workspace are required");
  SPECULA_REQUIRE(reinterpret_cast<uintptr_t>(p.scores) % 16 == 0,
                  "indexer: the score workspace must be 16-byte aligned");
  if (scores) {
    SPECULA_REQUIRE(p.q != nullptr && p.weights != nullptr && p.index_cache != nullptr && p.page_table != nullptr &&
                        p.token_req != nullptr,
                    "indexer: q, weights, index_cache, page_table and token_req are required");
    SPECULA_REQUIRE(reinterpret_cast<uintptr_t>(p.q) % 4 == 0, "indexer: q must be 4-byte aligned");
  }
  if (select) SPECULA_REQUIRE(p.out != nullptr, "indexer: out is required");
}

}  // namespace

IndexerConfig select_indexer(const IndexerParams& p) {
  IndexerConfig c;
  const auto fail = [&c](const std::string& why) {
    c.unsupported = "indexer: " + why;
    return c;
  };
  if (p.index_head_dim != kIndexerHeadDim) {
    return fail("index_head_dim " + std::to_string(p.index_head_dim) + " is not supported; supported: " +
                std::to_string(kIndexerHeadDim));
  }
  if (p.n_heads != 32 && p.n_heads != 64 && p.n_heads != 128) {
    return fail("n_heads " + std::to_string(p.n_heads) + " is not supported; supported: 32, 64, 128");
  }
  if (p.topk < 1 || p.topk > kIndexerMaxTopk) {
    return fail("topk " + std::to_string(p.topk) + " is not supported; supported: 1 to " +
                std::to_string(kIndexerMaxTopk));
  }
  if (p.page_size < 1) return fail("page_size " + std::to_string(p.page_size) + " is not valid; it must be >= 1");
  if (p.num_tokens < 0 || p.max_kv_len < 0 || p.max_pages < 0) {
    return fail("negative size: num_tokens " + std::to_string(p.num_tokens) + ", max_kv_len " +
                std::to_string(p.max_kv_len) + ", max_pages " + std::to_string(p.max_pages));
  }
  if ((static_cast<int64_t>(p.max_kv_len) + kBlockKeys - 1) / kBlockKeys > kMaxGridY) {
    return fail("max_kv_len " + std::to_string(p.max_kv_len) + " exceeds the supported " +
                std::to_string(static_cast<int64_t>(kMaxGridY) * kBlockKeys));
  }
  c.workspace_bytes = indexer_workspace_bytes(p.num_tokens, p.max_kv_len);
  c.head_tiles_per_warp = p.n_heads == 128 ? 2 : 1;
  c.score_warps = p.n_heads / 16 / c.head_tiles_per_warp;
  c.contiguous_tiles = p.page_size % kTileKeys == 0 && reinterpret_cast<uintptr_t>(p.index_cache) % 16 == 0;
  c.select_smem_bytes = block_topk::smem_bytes(p.topk);
  return c;
}

void launch_indexer_scores(const IndexerParams& p, cudaStream_t stream) {
  const IndexerConfig c = select_indexer(p);
  require_launchable(p, c, /*scores=*/true, /*select=*/false);
  if (p.num_tokens == 0 || p.max_kv_len == 0) return;
  const int64_t stride = indexer_score_stride(p.max_kv_len);
  const dim3 grid(static_cast<unsigned>(p.num_tokens),
                  static_cast<unsigned>((p.max_kv_len + kBlockKeys - 1) / kBlockKeys));
  const dim3 block(static_cast<unsigned>(32 * c.score_warps));
  if (c.head_tiles_per_warp == 2) {
    indexer_scores_kernel<2><<<grid, block, 0, stream>>>(p, stride, c.contiguous_tiles);
  } else {
    indexer_scores_kernel<1><<<grid, block, 0, stream>>>(p, stride, c.contiguous_tiles);
  }
  CUDA_CHECK(cudaGetLastError());
}

void launch_indexer_select(const IndexerParams& p, cudaStream_t stream) {
  const IndexerConfig c = select_indexer(p);
  require_launchable(p, c, /*scores=*/false, /*select=*/true);
  if (p.num_tokens == 0) return;
  // The most any supported topk needs, so later launches, captured ones included, need no call.
  raise_dynamic_smem(indexer_select_kernel, block_topk::smem_bytes(kIndexerMaxTopk));
  indexer_select_kernel<<<static_cast<unsigned>(p.num_tokens), block_topk::kThreads, c.select_smem_bytes, stream>>>(
      p, indexer_score_stride(p.max_kv_len));
  CUDA_CHECK(cudaGetLastError());
}

void launch_indexer_topk(const IndexerParams& p, cudaStream_t stream) {
  launch_indexer_scores(p, stream);
  launch_indexer_select(p, stream);
}

}  // namespace specula::cuda_kernels
