// Absorbed MLA attention kernels (see mla_attention.h). Layout of one block (256 threads):
//   warp w: row group rg = w % 4 (16 query rows), half = w / 4. For S = Q K^T a warp computes
//   its 16 rows x 32 of the tile's 64 keys; the two halves exchange row maxima and write P to
//   shared memory; for O += P V a warp owns its 16 rows x 256 of the 512 latent columns, so a
//   thread keeps 128 f32 accumulators.
// Shared memory: Q (64 x 576 bf16), K tiles (64 x 576 bf16; two stages for bf16 caches, one
// plus a raw 64 x 656-byte staging tile for fp8_ds_mla, dequantised to bf16 in shared memory),
// P (64 x 64 bf16) and row statistics. Rows of 16-byte chunks are XOR-swizzled by row & 7 so
// that ldmatrix reads of 8 rows at one column hit 8 different bank groups.
#include "specula/attention/mla/cuda/kernels/mla_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "specula/attention/cuda/kernels/convert.cuh"
#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/mla/cuda/kernels/mla_items.cuh"
#include "specula/attention/mla/cuda/kernels/mla_wgmma.h"
#include "specula/core/cuda_check.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kDim = kMlaLoraRank + kMlaRopeDim;  // 576
constexpr int kChunks = kDim / 8;                  // 16-byte chunks per bf16 row: 72
constexpr int kRowBytes = kDim * 2;                // 1152
constexpr int kTileBytes = kMlaBlockKeys * kRowBytes;
constexpr int kFp8RowBytes = kMlaLoraRank + 4 * (kMlaLoraRank / 128) + 2 * kMlaRopeDim;  // 656
constexpr int kPBytes = kMlaBlockRows * kMlaBlockKeys * 2;
constexpr float kNegInf = -INFINITY;

struct Smem {
  static constexpr int q = 0;
  static constexpr int k = q + kMlaBlockRows * kRowBytes;
  __host__ __device__ static constexpr int stats(bool fp8) { return k + (fp8 ? 1 : 2) * kTileBytes; }
  __host__ __device__ static constexpr int p(bool fp8) { return stats(fp8) + 4 * kMlaBlockRows * 4; }
  __host__ __device__ static constexpr int raw(bool fp8) { return p(fp8) + kPBytes; }
  __host__ __device__ static constexpr int total(bool fp8) { return raw(fp8) + (fp8 ? kMlaBlockKeys * kFp8RowBytes : 0); }
};

__device__ __forceinline__ int swz(int row, int chunk) { return row * kRowBytes + ((chunk ^ (row & 7)) << 4); }
__device__ __forceinline__ int swz_p(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

using mla::Item;
using mla::decode_item;
using mla::item_of;
using mla::key_slot;

__device__ void load_q(const MlaAttentionParams& p, const Item& it, uint8_t* smem) {
  const auto* q = static_cast<const uint8_t*>(p.q);
  for (int c = threadIdx.x; c < kMlaBlockRows * kChunks; c += kThreads) {
    const int row = c / kChunks;
    const int chunk = c % kChunks;
    const bool valid = row < it.rows;
    const uint8_t* src = q + (valid ? (it.row0 + row) * kRowBytes + chunk * 16 : 0);
    cp_async_16(smem + Smem::q + swz(row, chunk), src, valid);
  }
}

// bf16 cache: the tile's rows straight into a swizzled K stage (zeros for missing keys, so
// masked products stay finite).
__device__ void load_tile_bf16(const MlaAttentionParams& p, const Item& it, int key0, uint8_t* stage) {
  for (int c = threadIdx.x; c < kMlaBlockKeys * kChunks; c += kThreads) {
    const int row = c / kChunks;
    const int chunk = c % kChunks;
    const int64_t slot = key_slot(p, it, key0 + row);
    const uint8_t* src = p.cache + (slot >= 0 ? slot * p.row_bytes + chunk * 16 : 0);
    cp_async_16(stage + swz(row, chunk), src, slot >= 0);
  }
}

// fp8 cache: raw 656-byte rows into the staging tile.
__device__ void load_tile_raw(const MlaAttentionParams& p, const Item& it, int key0, uint8_t* raw) {
  constexpr int kRawChunks = kFp8RowBytes / 16;  // 41
  for (int c = threadIdx.x; c < kMlaBlockKeys * kRawChunks; c += kThreads) {
    const int row = c / kRawChunks;
    const int chunk = c % kRawChunks;
    const int64_t slot = key_slot(p, it, key0 + row);
    const uint8_t* src = p.cache + (slot >= 0 ? slot * p.row_bytes + chunk * 16 : 0);
    cp_async_16(raw + row * kFp8RowBytes + chunk * 16, src, slot >= 0);
  }
}

// Staging tile -> bf16 K stage: value = float(e4m3) * tile scale, rounded to bf16 once (the
// MMA operand precision); the RoPE part is copied.
__device__ void dequantise_tile(const uint8_t* raw, uint8_t* stage) {
  constexpr int kTasks = kMlaLoraRank / 16 + kMlaRopeDim / 8;  // 32 conversions + 8 copies per row
  for (int c = threadIdx.x; c < kMlaBlockKeys * kTasks; c += kThreads) {
    const int row = c / kTasks;
    const int task = c % kTasks;
    const uint8_t* src_row = raw + row * kFp8RowBytes;
    if (task >= kMlaLoraRank / 16) {
      const int chunk = task - kMlaLoraRank / 16;
      *reinterpret_cast<uint4*>(stage + swz(row, kMlaLoraRank / 8 + chunk)) =
          *reinterpret_cast<const uint4*>(src_row + kMlaLoraRank + 4 * (kMlaLoraRank / 128) + chunk * 16);
      continue;
    }
    const uint4 packed = *reinterpret_cast<const uint4*>(src_row + task * 16);
    const float scale = reinterpret_cast<const float*>(src_row + kMlaLoraRank)[task / 8];
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    uint32_t out[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float f[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        __nv_fp8_e4m3 v;
        v.__x = static_cast<__nv_fp8_storage_t>((words[w] >> (8 * b)) & 0xffu);
        f[b] = static_cast<float>(v) * scale;
      }
      out[2 * w] = pack2<__nv_bfloat16>(f[0], f[1]);
      out[2 * w + 1] = pack2<__nv_bfloat16>(f[2], f[3]);
    }
    *reinterpret_cast<uint4*>(stage + swz(row, 2 * task)) = make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(stage + swz(row, 2 * task + 1)) = make_uint4(out[4], out[5], out[6], out[7]);
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_kernel(const MlaAttentionParams p) {
  if (p.slots == nullptr && static_cast<int>(blockIdx.x) >= *p.num_items) return;
  extern __shared__ __align__(128) uint8_t smem[];
  const Item it = decode_item(p, item_of(p));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rg = warp & 3;
  const int half = warp >> 2;
  const int g = lane >> 2;
  const int tq = lane & 3;
  float* s_max = reinterpret_cast<float*>(smem + Smem::stats(kFp8));  // [2][64]
  float* s_sum = s_max + 2 * kMlaBlockRows;                             // [2][64]
  uint8_t* s_p = smem + Smem::p(kFp8);
  uint8_t* raw = smem + Smem::raw(kFp8);

  // Per-lane facts of its two rows (r = rg * 16 + g and + 8): the last visible key position and
  // the tree bits (dense only).
  int limit[2];
  uint64_t bits[2];
  int draft0 = 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rg * 16 + g + 8 * i;
    limit[i] = -1;
    bits[i] = ~0ull;
    if (r >= it.rows) continue;
    if (p.slots != nullptr) {
      limit[i] = INT32_MAX;
      continue;
    }
    const int token = static_cast<int>((it.row0 + r) / p.num_q_heads);
    const int index = token - p.first_token[it.unit];
    limit[i] = it.kv_len - it.q_len + index;
    if (p.tree_bits != nullptr) bits[i] = p.tree_bits[token];
  }
  if (p.slots == nullptr) draft0 = it.kv_len - it.q_len;

  float acc[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};
  float l_run[2] = {0.0f, 0.0f};

  const int num_tiles = it.key_end > it.key_begin ? (it.key_end - it.key_begin + kMlaBlockKeys - 1) / kMlaBlockKeys : 0;
  load_q(p, it, smem);
  if (num_tiles > 0) {
    if constexpr (kFp8) {
      load_tile_raw(p, it, it.key_begin, raw);
    } else {
      load_tile_bf16(p, it, it.key_begin, smem + Smem::k);
    }
  }
  cp_async_commit();
  if constexpr (kFp8) {
    if (num_tiles > 0) {
      cp_async_wait<0>();
      __syncthreads();
      dequantise_tile(raw, smem + Smem::k);
      __syncthreads();
      if (num_tiles > 1) load_tile_raw(p, it, it.key_begin + kMlaBlockKeys, raw);
      cp_async_commit();
    }
  }

  for (int t = 0; t < num_tiles; ++t) {
    const int key0 = it.key_begin + t * kMlaBlockKeys;
    uint8_t* stage;
    if constexpr (kFp8) {
      stage = smem + Smem::k;
      if (t > 0) {
        cp_async_wait<0>();
        __syncthreads();
        dequantise_tile(raw, stage);
        __syncthreads();
        if (t + 1 < num_tiles) load_tile_raw(p, it, key0 + kMlaBlockKeys, raw);
        cp_async_commit();
      }
    } else {
      stage = smem + Smem::k + (t & 1) * kTileBytes;
      if (t + 1 < num_tiles) load_tile_bf16(p, it, key0 + kMlaBlockKeys, smem + Smem::k + ((t + 1) & 1) * kTileBytes);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
    }

    // S = Q K^T: 16 rows x 32 keys per warp.
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 4
    for (int kc = 0; kc < kDim / 16; ++kc) {
      uint32_t a[4];
      ldmatrix_x4(a, smem + Smem::q + swz(rg * 16 + (lane & 15), 2 * kc + (lane >> 4)));
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        uint32_t b[4];
        const int key = half * 32 + pair * 16 + (lane >> 4) * 8 + (lane & 7);
        ldmatrix_x4(b, stage + swz(key, 2 * kc + ((lane >> 3) & 1)));
        mma_16816<__nv_bfloat16>(s[2 * pair], a, b[0], b[1]);
        mma_16816<__nv_bfloat16>(s[2 * pair + 1], a, b[2], b[3]);
      }
    }

    // Mask, scale (log2 domain) and the row maxima of this warp's 32 keys.
    float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        const int j = key0 + half * 32 + n * 8 + 2 * tq + (e & 1);
        bool visible = j < it.key_end && j <= limit[i];
        if (p.slots != nullptr) {
          visible = visible && p.slots[static_cast<int64_t>(it.unit) * p.topk + j] >= 0;
        } else if (p.tree_bits != nullptr && j >= draft0) {  // tree steps have q_len <= 64
          visible = visible && ((bits[i] >> (j - draft0)) & 1ull);
        }
        s[n][e] = visible ? s[n][e] * p.scale_log2 : kNegInf;
        tile_max[i] = fmaxf(tile_max[i], s[n][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      if (tq == 0) s_max[half * kMlaBlockRows + rg * 16 + g + 8 * i] = tile_max[i];
    }
    __syncthreads();
    float alpha[2];
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rg * 16 + g + 8 * i;
      const float m_new = fmaxf(m_run[i], fmaxf(s_max[r], s_max[kMlaBlockRows + r]));
      // A row that has seen no key yet keeps -inf; subtracting 0 instead avoids inf - inf.
      base[i] = m_new == kNegInf ? 0.0f : m_new;
      alpha[i] = exp2f(m_run[i] - base[i]);
      m_run[i] = m_new;
      l_run[i] *= alpha[i];
    }
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float p0 = exp2f(s[n][0] - base[0]);
      const float p1 = exp2f(s[n][1] - base[0]);
      const float p2 = exp2f(s[n][2] - base[1]);
      const float p3 = exp2f(s[n][3] - base[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int key = half * 32 + n * 8 + 2 * tq;
      const int r = rg * 16 + g;
      *reinterpret_cast<uint32_t*>(s_p + swz_p(r, key >> 3) + (key & 7) * 2) = pack2<__nv_bfloat16>(p0, p1);
      *reinterpret_cast<uint32_t*>(s_p + swz_p(r + 8, key >> 3) + (key & 7) * 2) = pack2<__nv_bfloat16>(p2, p3);
    }
    __syncthreads();

    // O += P V over this warp's 256 latent columns.
#pragma unroll
    for (int kk = 0; kk < kMlaBlockKeys / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, s_p + swz_p(rg * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int dp = 0; dp < 16; ++dp) {
        uint32_t b[4];
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x4_trans(b, stage + swz(key, half * 32 + dp * 2 + (lane >> 4)));
        mma_16816<__nv_bfloat16>(acc[2 * dp], a, b[0], b[1]);
        mma_16816<__nv_bfloat16>(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();
  }

  cp_async_wait<0>();  // nothing may still be landing when the block exits (no tiles: Q only)
  // Row sums: quad lanes, then the two halves.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    if (tq == 0) s_sum[half * kMlaBlockRows + rg * 16 + g + 8 * i] = l_run[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rg * 16 + g + 8 * i;
    if (r >= it.rows) continue;
    const float l = s_sum[r] + s_sum[kMlaBlockRows + r];
    const int64_t row = it.row0 + r;
    const float lse2 = l > 0.0f ? m_run[i] + log2f(l) : kNegInf;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (p.num_splits > 1) {
      float* dst = p.part_o + (static_cast<int64_t>(it.split) * p.num_tokens * p.num_q_heads + row) * kMlaLoraRank;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        const int col = half * 256 + n * 8 + 2 * tq;
        *reinterpret_cast<float2*>(dst + col) = make_float2(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv);
      }
      if (tq == 0) p.part_lse[static_cast<int64_t>(it.split) * p.num_tokens * p.num_q_heads + row] = lse2;
      continue;
    }
    float lse = lse2 * 0.6931471805599453f;
    if (p.sinks != nullptr) {
      const float sink = p.sinks[row % p.num_q_heads];
      const float m = fmaxf(lse, sink);
      const float merged = m + logf(expf(lse - m) + expf(sink - m));
      inv *= expf(lse - merged);
      lse = merged;
    }
    auto* out = static_cast<__nv_bfloat16*>(p.out) + row * kMlaLoraRank;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      const int col = half * 256 + n * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(out + col) = pack2<__nv_bfloat16>(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv);
    }
    if (p.lse != nullptr && tq == 0 && half == 0) p.lse[row] = lse;
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

size_t mla_attention_smem_bytes(bool fp8) { return static_cast<size_t>(Smem::total(fp8)); }

void launch_mla_attention(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.max_items == 0) return;
  const bool fp8 = params.fp8 != 0;
  if (!fp8) {
    launch_mla_wgmma(params, stream);
    return;
  }
  const size_t smem = mla_attention_smem_bytes(fp8);
  // Attributes are per function and cheap to set; setting them every launch keeps this stateless.
  if (fp8) {
    CUDA_CHECK(cudaFuncSetAttribute(mla_attention_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    mla_attention_kernel<true><<<params.max_items, kThreads, smem, stream>>>(params);
  } else {
    CUDA_CHECK(cudaFuncSetAttribute(mla_attention_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    mla_attention_kernel<false><<<params.max_items, kThreads, smem, stream>>>(params);
  }
  CUDA_CHECK(cudaGetLastError());
}

void launch_mla_combine(const MlaAttentionParams& params, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_q_heads;
  if (rows == 0 || params.num_splits <= 1) return;
  mla_combine_kernel<<<static_cast<unsigned>(rows), kMlaLoraRank / 4, 0, stream>>>(params);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
