// The skinny tensor-core product. A block owns 128 weight rows (a gated block the gate rows and
// the up rows of 64 outputs) and walks its inputs in 64-wide tiles: the weights go from global to
// shared memory through a ring of kStages cp.async stages (full 128-byte lines, many in flight, no
// registers held), each warp takes its 16-row tile from there with ldmatrix into mma.m16n8k16's A
// registers, and the activations (the 8-column B operand) come from global memory through the L1,
// which all 8 warps share: per weight byte a block reads rows / 64 bytes of f32 activations.
// Products with too few row groups to fill the GPU split their inputs over blocks (blockIdx.y) and
// the last block of a group adds the partial sums in split order, so results depend only on the
// product's shape.
#include "specula/model/cuda/skinny_gemm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/core/cuda_smem.h"
#include "specula/core/error.h"
#include "specula/model/cuda/activation.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kWarps = 8;

enum Epilogue { kPlain, kSiluMul, kGeluMul };

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 a, __nv_bfloat16 b) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(a)) | (static_cast<uint32_t>(__bfloat16_as_ushort(b)) << 16);
}

// c += a b for one m16n8k16 tile, bf16 in, f32 accumulate.
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A row's B registers for one 16-input step at k: inputs k + 2t, k + 2t + 1 (b0) and k + 2t + 8,
// k + 2t + 9 (b1); f32 rows give a hi pair (b[0], b[1]) and a lo pair (b[2], b[3]: x - hi rounded).
__device__ __forceinline__ void activation_terms(const float* x, uint32_t (&b)[4]) {
  const float2 p = *reinterpret_cast<const float2*>(x);
  const float2 q = *reinterpret_cast<const float2*>(x + 8);
  const __nv_bfloat162 hp = __floats2bfloat162_rn(p.x, p.y), hq = __floats2bfloat162_rn(q.x, q.y);
  const __nv_bfloat162 lp = __floats2bfloat162_rn(p.x - __low2float(hp), p.y - __high2float(hp));
  const __nv_bfloat162 lq = __floats2bfloat162_rn(q.x - __low2float(hq), q.y - __high2float(hq));
  b[0] = *reinterpret_cast<const uint32_t*>(&hp);
  b[1] = *reinterpret_cast<const uint32_t*>(&hq);
  b[2] = *reinterpret_cast<const uint32_t*>(&lp);
  b[3] = *reinterpret_cast<const uint32_t*>(&lq);
}
__device__ __forceinline__ void activation_terms(const __nv_bfloat16* x, uint32_t (&b)[4]) {
  b[0] = *reinterpret_cast<const uint32_t*>(x);
  b[1] = *reinterpret_cast<const uint32_t*>(x + 8);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& a0, uint32_t& a1, uint32_t& a2, uint32_t& a3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
               : "r"(addr));
}

constexpr int kCols = 16 * kWarps;  // weight rows per block
constexpr int kTileK = 64;           // inputs per stage: one 128-byte line of each weight row
constexpr int kStages = 4;
constexpr int kStageBytes = kCols * kTileK * 2;
constexpr int kMinTilesPerSplit = 4;
constexpr int kMaxSplits = 16;
constexpr int kTilePad = 4;  // result rows 132 floats apart: the fragment stores hit 32 banks

// kT activation tiles of 8 rows. Block (bx, by): weight rows bx * 128 .. + 127 (gated: outputs
// bx * 64 .. + 63, gate rows then up rows), input tiles by * per_split .. + per_split - 1.
// Shared memory holds a stage as 128 rows of 8 16-byte chunks, chunk c of row r at c ^ (r % 8):
// the 8 rows one ldmatrix matrix reads then sit in 8 different bank groups.
template <int kT, typename TX, int kEpi>
__global__ void __launch_bounds__(kWarps * 32) skinny_kernel(const __nv_bfloat16* __restrict__ w,
                                                              const TX* __restrict__ x, float* __restrict__ y, int in,
                                                              int out, int rows, int per_split,
                                                              float* __restrict__ partial,
                                                              unsigned* __restrict__ counters) {
  constexpr bool kSplitX = sizeof(TX) == 4;
  constexpr int kR = 8 * kT;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ float tile[kR][kCols + kTilePad];
  __shared__ bool last;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int group = static_cast<int>(blockIdx.x), split = static_cast<int>(blockIdx.y);
  const int splits = static_cast<int>(gridDim.y);
  const int first_tile = split * per_split;
  const int tiles = min(in / kTileK, first_tile + per_split) - first_tile;
  const uint32_t ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(ring));

  // This thread's four 16-byte copies per stage: rows tid / 8 + 32 c, chunk tid % 8. Rows past
  // `out` copy the last row (valid memory); their sums are not stored.
  const __nv_bfloat16* src[4];
  uint32_t dst[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int r = tid / 8 + 32 * c, chunk = tid % 8;
    int row;
    if constexpr (kEpi == kPlain) {
      row = min(group * kCols + r, out - 1);
    } else {
      row = min(group * (kCols / 2) + r % (kCols / 2), out - 1) + (r < kCols / 2 ? 0 : out);
    }
    src[c] = w + static_cast<int64_t>(row) * in + static_cast<int64_t>(first_tile) * kTileK + chunk * 8;
    dst[c] = static_cast<uint32_t>(r * (kTileK * 2) + ((chunk ^ (r % 8)) * 16));
  }
  auto issue = [&](int t) {
    if (t < tiles) {
      const uint32_t stage = ring_base + static_cast<uint32_t>((t % kStages) * kStageBytes);
#pragma unroll
      for (int c = 0; c < 4; ++c) cp_async16(stage + dst[c], src[c] + static_cast<int64_t>(t) * kTileK);
    }
    cp_async_commit();
  };
  // The weights do not depend on earlier kernels: the first stages are requested before the wait
  // for the activations (cuda_pdl.cuh).
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) issue(t);
  pdl_wait();
  pdl_trigger();

  // ldmatrix.x4: lanes 8 m .. 8 m + 7 address matrix m's rows: m = 0 rows 0-7 of the warp's tile,
  // first 8 inputs of the step; 1 rows 8-15; 2 rows 0-7, next 8 inputs; 3 rows 8-15, next 8.
  const int a_row = warp * 16 + (lane / 8 % 2) * 8 + lane % 8;
  const int a_half = lane / 16;
  const uint32_t a_offset = static_cast<uint32_t>(a_row * (kTileK * 2));
  const int a_swizzle = a_row % 8;
  const TX* x_rows[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    // Activation rows past `rows` repeat the last one (valid memory, sums not stored).
    x_rows[t] = x + static_cast<int64_t>(min(8 * t + g, rows - 1)) * in + static_cast<int64_t>(first_tile) * kTileK + 2 * t4;
  }
  float acc[kT][4];
#pragma unroll
  for (int t = 0; t < kT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage t is in for every thread, and stage t - 1 is read by every warp
    issue(t + kStages - 1);
    const uint32_t stage = ring_base + static_cast<uint32_t>((t % kStages) * kStageBytes) + a_offset;
#pragma unroll
    for (int step = 0; step < kTileK / 16; ++step) {
      uint32_t a0, a1, a2, a3;
      ldmatrix_x4(stage + static_cast<uint32_t>(((2 * step + a_half) ^ a_swizzle) * 16), a0, a1, a2, a3);
#pragma unroll
      for (int r = 0; r < kT; ++r) {
        uint32_t b[4];
        activation_terms(x_rows[r] + t * kTileK + step * 16, b);
        mma(acc[r], a0, a1, a2, a3, b[0], b[1]);
        if constexpr (kSplitX) mma(acc[r], a0, a1, a2, a3, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

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
    for (int i = tid; i < kR * kCols; i += kWarps * 32) __stcg(mine + i, tile[i / kCols][i % kCols]);
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(counters + group, 1u) == static_cast<unsigned>(splits - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = tid; i < kR * kCols; i += kWarps * 32) {
      float v = 0.0f;
      for (int p = 0; p < splits; ++p) v += __ldcg(group_partial + static_cast<int64_t>(p) * kR * kCols + i);
      tile[i / kCols][i % kCols] = v;
    }
    if (tid == 0) counters[group] = 0;
    __syncthreads();
  }
  constexpr int kOut = kEpi == kPlain ? kCols : kCols / 2;
  for (int i = tid; i < kR * kOut; i += kWarps * 32) {
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

// Two blocks per multiprocessor at least: products with fewer row groups split their inputs, each
// split keeping kMinTilesPerSplit input tiles or more.
Plan plan(int in, int groups, int sms) {
  const int tiles = in / kTileK;
  int splits = groups >= 2 * sms ? 1 : (2 * sms + groups - 1) / groups;
  splits = std::min({splits, kMaxSplits, std::max(1, tiles / kMinTilesPerSplit)});
  const int per = (tiles + splits - 1) / splits;
  return {groups, (tiles + per - 1) / per, per};
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
  constexpr size_t kRing = size_t{kStages} * kStageBytes;
  raise_dynamic_smem(skinny_kernel<kT, TX, kEpi>, kRing);
  launch_pdl(skinny_kernel<kT, TX, kEpi>, dim3(static_cast<unsigned>(p.groups), static_cast<unsigned>(p.splits)),
             dim3(kWarps * 32), kRing, s, static_cast<const __nv_bfloat16*>(w), x, y, in, out, rows, p.per_split,
             scratch.partial, scratch.counters);
}

template <typename TX, int kEpi>
void launch(const void* w, const TX* x, float* y, int rows, int in, int out, SkinnyScratch scratch, cudaStream_t s) {
  SPECULA_REQUIRE(rows >= 1 && rows <= kSkinnyMaxRows && skinny_fits(in) && out >= 1 && scratch.multiprocessors > 0,
                  "skinny_gemm: rows " + std::to_string(rows) + ", in " + std::to_string(in) + ", out " +
                      std::to_string(out) + ": rows must be 1..32, in a positive multiple of 64 and out >= 1");
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
