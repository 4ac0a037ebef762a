// The skinny tensor-core product. Each warp of a block owns a 16-row tile of the weights (a block
// 128 rows; a gated block the gate rows and the up rows of 64 outputs), so the block's 8 warps
// read the same activations, which the L1 serves after the first: per weight byte a block reads
// rows / 64 bytes of f32 activations from L2 (16-row tiles per block would read 16 times more, and
// at 8+ rows that traffic, not the weights, set the speed). Products with too few tiles to fill
// the GPU split their inputs over blocks (blockIdx.y) and the last block of a tile group adds the
// partial sums in split order.
//
// Inside a 32-input slice each lane streams one 16-byte piece of weight row g and one of row g + 8
// (g = lane / 4, piece lane % 4): coalesced 64-byte runs per row, and a warp walks its slices in
// order. mma.m16n8k16 wants a lane's A registers at inputs 2t, 2t + 1 and 2t + 8, 2t + 9
// (t = lane % 4) of a 16-input step; a dot product does not care in which order the inputs are
// paired, so the slice's 32 inputs are renumbered: step s, logical input 2t + j (+ 8) is physical
// input 8t + 4s + j (+ 2). The B (activation) registers follow the same renumbering, which makes
// them four consecutive values of one activation row per lane and step: one float4 (f32) or half
// a uint4 (bf16) load.
#include "specula/model/cuda/skinny_gemm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/error.h"
#include "specula/model/cuda/activation.cuh"
#include "specula/model/cuda/stream_load.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kWarps = 8;

enum Epilogue { kPlain, kSiluMul, kGeluMul };

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 a, __nv_bfloat16 b) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(a)) | (static_cast<uint32_t>(__bfloat16_as_ushort(b)) << 16);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// c += a b for one m16n8k16 tile, bf16 in, f32 accumulate.
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One activation row's B registers for a slice: b[s][0..1] the hi term of step s, b[s][2..3] the
// lo term (f32 rows only: x - hi rounded to bf16).
__device__ __forceinline__ void activation_terms(const float* x, uint32_t (&b)[2][4]) {
  const float4 p = *reinterpret_cast<const float4*>(x);
  const float4 q = *reinterpret_cast<const float4*>(x + 4);
  const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    __nv_bfloat16 h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      h[j] = __float2bfloat16_rn(v[4 * s + j]);
      l[j] = __float2bfloat16_rn(v[4 * s + j] - __bfloat162float(h[j]));
    }
    b[s][0] = pack_bf16(h[0], h[1]);
    b[s][1] = pack_bf16(h[2], h[3]);
    b[s][2] = pack_bf16(l[0], l[1]);
    b[s][3] = pack_bf16(l[2], l[3]);
  }
}
__device__ __forceinline__ void activation_terms(const __nv_bfloat16* x, uint32_t (&b)[2][4]) {
  const uint4 v = *reinterpret_cast<const uint4*>(x);
  b[0][0] = v.x, b[0][1] = v.y, b[1][0] = v.z, b[1][1] = v.w;
}

constexpr int kCols = 16 * kWarps;  // weight rows per block
constexpr int kMinSlicesPerSplit = 8;
constexpr int kMaxSplits = 16;
constexpr int kTilePad = 4;  // tile rows 132 floats apart: the fragment stores hit 32 banks

// kT activation tiles of 8 rows, kU slices in flight per warp. Block (bx, by): weight rows
// bx * 128 .. + 127 (gated: outputs bx * 64 .. + 63), slices by * per_split .. + per_split - 1.
template <int kT, int kU, typename TX, int kEpi>
__global__ void __launch_bounds__(kWarps * 32) skinny_kernel(const uint4* __restrict__ w, const TX* __restrict__ x,
                                                              float* __restrict__ y, int in, int out, int rows,
                                                              int per_split, float* __restrict__ partial,
                                                              unsigned* __restrict__ counters) {
  constexpr bool kSplitX = sizeof(TX) == 4;
  constexpr int kR = 8 * kT;
  __shared__ float tile[kR][kCols + kTilePad];
  __shared__ bool last;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int group = static_cast<int>(blockIdx.x), split = static_cast<int>(blockIdx.y);
  const int splits = static_cast<int>(gridDim.y);
  const int row_pieces = in / 8;
  // Weight rows past `out` read the last row (valid memory); their sums are not stored.
  const uint4* wr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (kEpi == kPlain) {
      wr[h] = w + static_cast<int64_t>(min(group * kCols + warp * 16 + g + 8 * h, out - 1)) * row_pieces + t4;
    } else {
      const int output = min(group * (kCols / 2) + (warp % 4) * 16 + g + 8 * h, out - 1);
      wr[h] = w + static_cast<int64_t>(output + (warp / 4) * out) * row_pieces + t4;
    }
  }
  float acc[kT][4];
#pragma unroll
  for (int t = 0; t < kT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  auto compute = [&](const uint4 (&wv)[2], int slice) {
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      // Activation rows past `rows` repeat the last one (valid memory, sums not stored).
      const int r = min(8 * t + g, rows - 1);
      uint32_t b[2][4];
      activation_terms(x + static_cast<int64_t>(r) * in + slice * 32 + 8 * t4, b);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint32_t a0 = word(wv[0], 2 * s), a1 = word(wv[1], 2 * s);
        const uint32_t a2 = word(wv[0], 2 * s + 1), a3 = word(wv[1], 2 * s + 1);
        mma(acc[t], a0, a1, a2, a3, b[s][0], b[s][1]);
        if constexpr (kSplitX) mma(acc[t], a0, a1, a2, a3, b[s][2], b[s][3]);
      }
    }
  };
  const int end = min(in / 32, (split + 1) * per_split);
  int slice = split * per_split;
  uint4 wv[kU][2];
  auto load_group = [&](int first) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int h = 0; h < 2; ++h) wv[u][h] = load_stream(wr[h] + (first + u) * 4);
    }
  };
  // The weights do not depend on earlier kernels: the first group's loads go out before the
  // wait for the activations (cuda_pdl.cuh).
  bool full = slice + kU <= end;
  if (full) load_group(slice);
  pdl_wait();
  pdl_trigger();
  while (full) {
#pragma unroll
    for (int u = 0; u < kU; ++u) compute(wv[u], slice + u);
    slice += kU;
    full = slice + kU <= end;
    if (full) load_group(slice);
  }
  for (; slice < end; ++slice) {
    const uint4 one[2] = {load_stream(wr[0] + slice * 4), load_stream(wr[1] + slice * 4)};
    compute(one, slice);
  }
  // Accumulator c0, c1: weight row g, activation rows 2 t4, 2 t4 + 1; c2, c3: weight row g + 8.
  const int col = warp * 16 + g;
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const int r = 8 * t + 2 * t4;
    tile[r][col] = acc[t][0];
    tile[r + 1][col] = acc[t][1];
    tile[r][col + 8] = acc[t][2];
    tile[r + 1][col + 8] = acc[t][3];
  }
  __syncthreads();
  if (splits > 1) {
    float* group_partial = partial + static_cast<int64_t>(group) * splits * kR * kCols;
    float* mine = group_partial + static_cast<int64_t>(split) * kR * kCols;
    for (int i = static_cast<int>(threadIdx.x); i < kR * kCols; i += kWarps * 32) __stcg(mine + i, tile[i / kCols][i % kCols]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + group, 1u) == static_cast<unsigned>(splits - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = static_cast<int>(threadIdx.x); i < kR * kCols; i += kWarps * 32) {
      float v = 0.0f;
      for (int p = 0; p < splits; ++p) v += __ldcg(group_partial + static_cast<int64_t>(p) * kR * kCols + i);
      tile[i / kCols][i % kCols] = v;
    }
    if (threadIdx.x == 0) counters[group] = 0;
    __syncthreads();
  }
  constexpr int kOut = kEpi == kPlain ? kCols : kCols / 2;
  for (int i = static_cast<int>(threadIdx.x); i < kR * kOut; i += kWarps * 32) {
    const int r = i / kOut, c = i % kOut;
    const int feature = group * kOut + c;
    if (r >= rows || feature >= out) continue;
    float v = tile[r][c];
    if constexpr (kEpi != kPlain) v = gate_activation(v, kEpi == kGeluMul) * tile[r][c + kOut];
    y[static_cast<int64_t>(r) * out + feature] = v;
  }
}

struct Plan {
  int groups, splits, per_split;
};

// Two blocks per multiprocessor at least: products with fewer weight-row groups split their
// inputs, each split keeping kMinSlicesPerSplit slices or more.
Plan plan(int in, int groups, int sms) {
  const int slices = in / 32;
  int splits = groups >= 2 * sms ? 1 : (2 * sms + groups - 1) / groups;
  splits = std::min({splits, kMaxSplits, std::max(1, slices / kMinSlicesPerSplit)});
  const int per = (slices + splits - 1) / splits;
  return {groups, (slices + per - 1) / per, per};
}

template <int kT, typename TX, int kEpi>
void launch_tiles(const void* w, const TX* x, float* y, int rows, int in, int out, SkinnyScratch scratch,
                  cudaStream_t s) {
  constexpr int kOut = kEpi == kPlain ? kCols : kCols / 2;
  const Plan p = plan(in, (out + kOut - 1) / kOut, scratch.multiprocessors);
  SPECULA_ASSERT(p.splits == 1 || (scratch.partial != nullptr && scratch.counters != nullptr &&
                                   static_cast<int64_t>(p.groups) * p.splits * 8 * kT * kCols <=
                                       skinny_partial_floats(scratch.multiprocessors) &&
                                   p.groups <= skinny_counters(scratch.multiprocessors)),
                 "skinny_gemm: the split needs the scratch");
  launch_pdl(skinny_kernel<kT, 4, TX, kEpi>, dim3(static_cast<unsigned>(p.groups), static_cast<unsigned>(p.splits)),
             dim3(kWarps * 32), 0, s, static_cast<const uint4*>(w), x, y, in, out, rows, p.per_split, scratch.partial,
             scratch.counters);
}

template <typename TX, int kEpi>
void launch(const void* w, const TX* x, float* y, int rows, int in, int out, SkinnyScratch scratch, cudaStream_t s) {
  SPECULA_REQUIRE(rows >= 1 && rows <= kSkinnyMaxRows && skinny_fits(in) && out >= 1 && scratch.multiprocessors > 0,
                  "skinny_gemm: rows " + std::to_string(rows) + ", in " + std::to_string(in) + ", out " +
                      std::to_string(out) + ": rows must be 1..32, in a positive multiple of 32 and out >= 1");
  switch ((rows + 7) / 8) {
    case 1: launch_tiles<1, TX, kEpi>(w, x, y, rows, in, out, scratch, s); break;
    case 2: launch_tiles<2, TX, kEpi>(w, x, y, rows, in, out, scratch, s); break;
    case 3: launch_tiles<3, TX, kEpi>(w, x, y, rows, in, out, scratch, s); break;
    default: launch_tiles<4, TX, kEpi>(w, x, y, rows, in, out, scratch, s); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// Splits happen only for fewer than 2 x SMs groups, each into at most ceil(2 x SMs / groups)
// parts: fewer than 4 x SMs blocks of at most 32 x 128 partial sums; a counter per group.
int64_t skinny_partial_floats(int multiprocessors) { return int64_t{4} * multiprocessors * kSkinnyMaxRows * kCols; }
int skinny_counters(int multiprocessors) { return 2 * multiprocessors; }

void skinny_gemm(const void* w, const float* x, float* y, int rows, int in, int out, SkinnyScratch scratch,
                 cudaStream_t s) {
  launch<float, kPlain>(w, x, y, rows, in, out, scratch, s);
}

void skinny_gemm_xbf16(const void* w, const void* x, float* y, int rows, int in, int out, SkinnyScratch scratch,
                       cudaStream_t s) {
  launch<__nv_bfloat16, kPlain>(w, static_cast<const __nv_bfloat16*>(x), y, rows, in, out, scratch, s);
}

void skinny_gemm_gated(const void* w, const float* x, float* y, int rows, int in, int inter, bool gelu,
                       SkinnyScratch scratch, cudaStream_t s) {
  if (gelu) {
    launch<float, kGeluMul>(w, x, y, rows, in, inter, scratch, s);
  } else {
    launch<float, kSiluMul>(w, x, y, rows, in, inter, scratch, s);
  }
}

}  // namespace specula::cuda_kernels
