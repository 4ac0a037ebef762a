// The decode GEMV: one warp per output feature (a few when several activation rows share the
// weights); lanes stride over the row in 8-element (16-byte) chunks, four loads in flight per
// lane for one row (tiny matrices: one chunk per lane, split over warps), then a warp reduction
// per activation row.
#include <cuda_bf16.h>

#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/model/cuda/activation.cuh"
#include "specula/model/cuda/gemv.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;

// A streaming 16-byte load: read once, so it need not displace the activations in L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Two bf16 in one 32-bit word -> two f32 (exact: bf16 is the top half of an f32).
__device__ __forceinline__ float lo_bf16(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }

// Unpacks 8 bf16 weights.
__device__ __forceinline__ void unpack(const uint4& wv, float (&w)[8]) {
  w[0] = lo_bf16(wv.x), w[1] = hi_bf16(wv.x), w[2] = lo_bf16(wv.y), w[3] = hi_bf16(wv.y);
  w[4] = lo_bf16(wv.z), w[5] = hi_bf16(wv.z), w[6] = lo_bf16(wv.w), w[7] = hi_bf16(wv.w);
}

// Eight activations of one row as f32 (bf16 -> f32 is exact).
__device__ __forceinline__ void load_x8(const float* x, int64_t offset, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(x + offset);
  const float4 b = *reinterpret_cast<const float4*>(x + offset + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load_x8(const __nv_bfloat16* x, int64_t offset, float (&v)[8]) {
  unpack(*reinterpret_cast<const uint4*>(x + offset), v);
}

// One chunk of kFeat weight rows against kRows activation rows. The activations are loaded once
// per chunk and reused for every feature (with one feature per warp, re-reading them per row
// made several rows L1-bound). Each (row, feature) sum adds chunk dot products in ascending
// chunk order whatever kRows and kFeat are, so a row's result does not depend on the batch.
template <int kRows, int kFeat, typename TX>
__device__ __forceinline__ void accumulate(const uint4 (&wv)[kFeat], const TX* x, int in, int chunk, int rows,
                                           float (&acc)[kRows][kFeat]) {
  float w[kFeat][8];
#pragma unroll
  for (int f = 0; f < kFeat; ++f) unpack(wv[f], w[f]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    // Rows past `rows` repeat the last one (valid memory, results not stored): no branch stands
    // between the rows' loads, so they are all in flight at once.
    float v[8];
    load_x8(x, static_cast<int64_t>(min(r, rows - 1)) * in + chunk * 8, v);
#pragma unroll
    for (int f = 0; f < kFeat; ++f) {
      acc[r][f] += w[f][0] * v[0] + w[f][1] * v[1] + w[f][2] * v[2] + w[f][3] * v[3] + w[f][4] * v[4] + w[f][5] * v[5] +
                   w[f][6] * v[6] + w[f][7] * v[7];
    }
  }
}

// Plain: a warp computes features first .. first + kFeat - 1 of `out`. Gated (w stacks the gate
// rows over the up rows, `out` of each): a warp computes kFeat / 2 outputs, reading their gate
// rows and their up rows, and stores act(gate) * up, so the activation needs no kernel of its own.
enum Epilogue { kPlain, kSiluMul, kGeluMul };

// kSplit warps share each group of features, part p taking chunks p * 32 + lane + k * 32 kSplit
// and the parts' sums added in order through shared memory: a small matrix then has enough warps
// to keep memory busy without a sparse last wave. kSplit depends only on the matrix's shape, so
// a row's result still does not depend on the batch. With kRuntimeRows, `rows` (<= kRows)
// activation rows are present and only they are stored; otherwise there are kRows.
template <int kRows, int kFeat, int kUnrollChunks, int kSplit, bool kRuntimeRows, typename TX, int kEpi>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(const uint4* __restrict__ w, const TX* __restrict__ x,
                                                                  float* __restrict__ y, int in, int out, int rows) {
  if constexpr (!kRuntimeRows) rows = kRows;
  constexpr int kOut = kEpi == kPlain ? kFeat : kFeat / 2;
  constexpr int kGroups = kWarpsPerBlock / kSplit;
  __shared__ float partial[kSplit > 1 ? kGroups * kSplit * kRows * kFeat : 1];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int group = warp / kSplit;
  const int part = warp % kSplit;
  const int first = (static_cast<int>(blockIdx.x) * kGroups + group) * kOut;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (kSplit == 1 && first >= out) return;
  const bool active = first < out;
  const int chunks = active ? in / 8 : 0;
  // Features past the end read the last row (valid memory) and are not stored.
  const uint4* w_rows[kFeat];
#pragma unroll
  for (int f = 0; f < kFeat; ++f) {
    const int row = min(first + f % kOut, out - 1) + (f < kOut ? 0 : out);
    w_rows[f] = w + static_cast<int64_t>(row) * (in / 8);
  }
  float acc[kRows][kFeat];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kFeat; ++f) acc[r][f] = 0.0f;
  }
  constexpr int kStride = 32 * kSplit;
  uint4 wv[kUnrollChunks][kFeat];
  auto load_group = [&](int c) {
#pragma unroll
    for (int u = 0; u < kUnrollChunks; ++u) {
#pragma unroll
      for (int f = 0; f < kFeat; ++f) wv[u][f] = load_stream(w_rows[f] + c + kStride * u);
    }
  };
  // The weights do not depend on earlier kernels: the first group's loads are issued before
  // waiting for the activations, so they overlap the previous kernel's tail (cuda_pdl.cuh).
  int c = part * 32 + lane;
  bool full = c + kStride * (kUnrollChunks - 1) < chunks;
  if (full) load_group(c);
  pdl_wait();
  pdl_trigger();
  while (full) {
#pragma unroll
    for (int u = 0; u < kUnrollChunks; ++u) accumulate<kRows, kFeat>(wv[u], x, in, c + kStride * u, rows, acc);
    c += kStride * kUnrollChunks;
    full = c + kStride * (kUnrollChunks - 1) < chunks;
    if (full) load_group(c);
  }
  for (; c < chunks; c += kStride) {
    uint4 wv[kFeat];
#pragma unroll
    for (int f = 0; f < kFeat; ++f) wv[f] = load_stream(w_rows[f] + c);
    accumulate<kRows, kFeat>(wv, x, in, c, rows, acc);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kFeat; ++f) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc[r][f] += __shfl_xor_sync(0xffffffffu, acc[r][f], offset);
    }
  }
  if constexpr (kSplit > 1) {
    float* mine = partial + (group * kSplit + part) * kRows * kFeat;
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
#pragma unroll
        for (int f = 0; f < kFeat; ++f) mine[r * kFeat + f] = acc[r][f];
      }
    }
    __syncthreads();
    if (part != 0 || !active) return;
#pragma unroll
    for (int p = 1; p < kSplit; ++p) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
#pragma unroll
        for (int f = 0; f < kFeat; ++f) acc[r][f] += mine[p * kRows * kFeat + r * kFeat + f];
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) break;
#pragma unroll
      for (int f = 0; f < kOut; ++f) {
        if (first + f >= out) continue;
        const float v = kEpi == kPlain ? acc[r][f] : gate_activation(acc[r][f], kEpi == kGeluMul) * acc[r][f + kOut];
        y[static_cast<int64_t>(r) * out + first + f] = v;
      }
    }
  }
}

// One row: one feature per warp (two rows of weights when gated) with four chunks in flight
// (bandwidth-bound); several rows: four weight rows per warp sharing the activations.
template <int kRows, int kSplit, typename TX, int kEpi>
void launch(const void* w, const TX* x, float* y, int in, int out, cudaStream_t s) {
  constexpr int kFeat = kRows == 1 ? (kEpi == kPlain ? 1 : 2) : 4;
  constexpr int kUnrollChunks = kRows == 1 ? kUnroll / kFeat : 1;
  constexpr int kOut = kEpi == kPlain ? kFeat : kFeat / 2;
  const int per_block = kWarpsPerBlock / kSplit * kOut;
  const unsigned blocks = static_cast<unsigned>((out + per_block - 1) / per_block);
  launch_pdl(gemv_kernel<kRows, kFeat, kUnrollChunks, kSplit, false, TX, kEpi>, blocks, kWarpsPerBlock * 32, 0, s,
             static_cast<const uint4*>(w), x, y, in, out, kRows);
}

// Matrices of at most this many weights are latency-bound at decode sizes (the shipped model's
// and draft heads' 256-wide layers): one kernel for any row count, one feature (gated: one
// output) per warp so that every row adds only its FMAs and reduction to a warp's chain, and
// kTinySplit warps per feature when one warp would walk the row in several dependent loads.
constexpr int64_t kTinyWeights = int64_t{1} << 20;
constexpr int kTinySplit = 4;

bool tiny(int in, int weight_rows) { return static_cast<int64_t>(in) * weight_rows <= kTinyWeights; }
// A row of in / 8 chunks needs one load per lane of one warp, or of kTinySplit warps.
bool tiny_split(int in) { return in / 8 > 32; }

// One row exactly, or up to kGemvMaxRows (rows past `rows` computed on the last row's values and
// dropped: cheaper than a kernel per row count for latency-bound products).
template <int kSplit, typename TX, int kEpi>
void launch_tiny(const void* w, const TX* x, float* y, int rows, int in, int out, cudaStream_t s) {
  constexpr int kFeat = kEpi == kPlain ? 1 : 2;
  constexpr int kOut = kEpi == kPlain ? kFeat : kFeat / 2;
  const int per_block = kWarpsPerBlock / kSplit * kOut;
  const unsigned blocks = static_cast<unsigned>((out + per_block - 1) / per_block);
  if (rows == 1) {
    launch_pdl(gemv_kernel<1, kFeat, 1, kSplit, false, TX, kEpi>, blocks, kWarpsPerBlock * 32, 0, s,
               static_cast<const uint4*>(w), x, y, in, out, rows);
  } else {
    launch_pdl(gemv_kernel<kGemvMaxRows, kFeat, 1, kSplit, true, TX, kEpi>, blocks, kWarpsPerBlock * 32, 0, s,
               static_cast<const uint4*>(w), x, y, in, out, rows);
  }
}

// Two warps per feature group when one per group would leave the GPU's resident warps (about 40
// per SM with this kernel's registers) short of two full waves and each row is long enough to
// share: q|k|v, o_proj and down_proj of 8B-class shapes, gate|up of 1B-class ones. (Splitting the
// 8B's gated gate|up too measured 207-208 tok/s against 208, so it is not.)
bool split_rows(int in, int out) {
  static const int resident_warps = [] {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return 40 * sms;
  }();
  return in >= 2048 && out < 2 * resident_warps;
}

template <int kRows, typename TX, int kEpi>
void launch_split(const void* w, const TX* x, float* y, int in, int out, cudaStream_t s) {
  if (split_rows(in, out)) {
    launch<kRows, 2, TX, kEpi>(w, x, y, in, out, s);
  } else {
    launch<kRows, 1, TX, kEpi>(w, x, y, in, out, s);
  }
}

template <typename TX, int kEpi>
void launch_rows(const void* w, const TX* x, float* y, int rows, int in, int out, cudaStream_t s) {
  SPECULA_REQUIRE(rows >= 1 && rows <= kGemvMaxRows && in % 8 == 0 && out >= 1,
                  "gemv_bf16: rows " + std::to_string(rows) + ", in " + std::to_string(in) + ", out " +
                      std::to_string(out) + ": rows must be 1..8, in a multiple of 8 and out >= 1");
  // Gated: w holds 2 x out rows; judged as the plain product over w is, so both take one path.
  if (tiny(in, kEpi == kPlain ? out : 2 * out)) {
    if (tiny_split(in)) {
      launch_tiny<kTinySplit, TX, kEpi>(w, x, y, rows, in, out, s);
    } else {
      launch_tiny<1, TX, kEpi>(w, x, y, rows, in, out, s);
    }
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  switch (rows) {
    case 1: launch_split<1, TX, kEpi>(w, x, y, in, out, s); break;
    case 2: launch_split<2, TX, kEpi>(w, x, y, in, out, s); break;
    case 3: launch_split<3, TX, kEpi>(w, x, y, in, out, s); break;
    case 4: launch_split<4, TX, kEpi>(w, x, y, in, out, s); break;
    case 5: launch_split<5, TX, kEpi>(w, x, y, in, out, s); break;
    case 6: launch_split<6, TX, kEpi>(w, x, y, in, out, s); break;
    case 7: launch_split<7, TX, kEpi>(w, x, y, in, out, s); break;
    default: launch_split<8, TX, kEpi>(w, x, y, in, out, s); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void gemv_bf16(const void* w, const float* x, float* y, int rows, int in, int out, cudaStream_t s) {
  launch_rows<float, kPlain>(w, x, y, rows, in, out, s);
}

void gemv_bf16_xbf16(const void* w, const void* x, float* y, int rows, int in, int out, cudaStream_t s) {
  launch_rows<__nv_bfloat16, kPlain>(w, static_cast<const __nv_bfloat16*>(x), y, rows, in, out, s);
}

void gemv_bf16_gated(const void* w, const float* x, float* y, int rows, int in, int inter, bool gelu, cudaStream_t s) {
  if (gelu) {
    launch_rows<float, kGeluMul>(w, x, y, rows, in, inter, s);
  } else {
    launch_rows<float, kSiluMul>(w, x, y, rows, in, inter, s);
  }
}

}  // namespace specula::cuda_kernels
