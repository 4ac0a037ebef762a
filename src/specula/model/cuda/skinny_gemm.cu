// The skinny tensor-core product. A block owns 16 weight rows (32 for wide plain products; a
// gated block owns 16 gate rows and their 16 up rows) and its 8 warps split the inputs: warp w
// takes the 32-input slices w, w + 8, w + 16, ... and the warps' partial sums are added in warp
// order through shared memory, so a result depends only on the matrix's shape, never on which
// rows are present.
//
// Inside a slice each lane streams one 16-byte piece of weight row g and one of row g + 8
// (g = lane / 4, piece lane % 4): coalesced 64-byte runs per row. mma.m16n8k16 wants a lane's
// A registers at inputs 2t, 2t + 1 and 2t + 8, 2t + 9 (t = lane % 4) of a 16-input step; a dot
// product does not care in which order the inputs are paired, so the slice's 32 inputs are
// renumbered: step s, logical input 2t + j (+ 8) is physical input 8t + 4s + j (+ 2). The B
// (activation) registers follow the same renumbering, which makes them four consecutive values of
// one activation row per lane and step: one float4 (f32) or half a uint4 (bf16) load.
#include "specula/model/cuda/skinny_gemm.h"

#include <cuda_bf16.h>

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

// kT activation tiles of 8 rows, kA weight tiles of 16 rows per warp, kU slices in flight.
template <int kT, int kA, int kU, typename TX, int kEpi>
__global__ void __launch_bounds__(kWarps * 32) skinny_kernel(const uint4* __restrict__ w, const TX* __restrict__ x,
                                                              float* __restrict__ y, int in, int out, int rows) {
  constexpr bool kSplitX = sizeof(TX) == 4;
  constexpr int kBlockOut = kEpi == kPlain ? 16 * kA : 16;
  __shared__ float partial[kWarps][kA][kT][16 * 8];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int base = static_cast<int>(blockIdx.x) * kBlockOut;
  const int row_pieces = in / 8;
  // Weight rows past `out` read the last row (valid memory); their sums are not stored.
  const uint4* wr[kA][2];
#pragma unroll
  for (int a = 0; a < kA; ++a) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int feature = min(base + (kEpi == kPlain ? 16 * a : 0) + g + 8 * h, out - 1);
      const int row = feature + (kEpi != kPlain && a == 1 ? out : 0);
      wr[a][h] = w + static_cast<int64_t>(row) * row_pieces + t4;
    }
  }
  float acc[kA][kT][4];
#pragma unroll
  for (int a = 0; a < kA; ++a) {
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[a][t][0] = acc[a][t][1] = acc[a][t][2] = acc[a][t][3] = 0.0f;
  }
  const int slices = in / 32;
  auto compute = [&](const uint4 (&wv)[kA][2], int slice) {
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      // Activation rows past `rows` repeat the last one (valid memory, sums not stored).
      const int r = min(8 * t + g, rows - 1);
      uint32_t b[2][4];
      activation_terms(x + static_cast<int64_t>(r) * in + slice * 32 + 8 * t4, b);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
#pragma unroll
        for (int a = 0; a < kA; ++a) {
          const uint32_t a0 = word(wv[a][0], 2 * s), a1 = word(wv[a][1], 2 * s);
          const uint32_t a2 = word(wv[a][0], 2 * s + 1), a3 = word(wv[a][1], 2 * s + 1);
          mma(acc[a][t], a0, a1, a2, a3, b[s][0], b[s][1]);
          if constexpr (kSplitX) mma(acc[a][t], a0, a1, a2, a3, b[s][2], b[s][3]);
        }
      }
    }
  };
  uint4 wv[kU][kA][2];
  auto load_group = [&](int slice) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int a = 0; a < kA; ++a) {
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][a][h] = load_stream(wr[a][h] + (slice + kWarps * u) * 4);
      }
    }
  };
  // The weights do not depend on earlier kernels: the first group's loads go out before the
  // wait for the activations (cuda_pdl.cuh).
  int slice = warp;
  bool full = slice + kWarps * (kU - 1) < slices;
  if (full) load_group(slice);
  pdl_wait();
  pdl_trigger();
  while (full) {
#pragma unroll
    for (int u = 0; u < kU; ++u) compute(wv[u], slice + kWarps * u);
    slice += kWarps * kU;
    full = slice + kWarps * (kU - 1) < slices;
    if (full) load_group(slice);
  }
  for (; slice < slices; slice += kWarps) {
    uint4 one[kA][2];
#pragma unroll
    for (int a = 0; a < kA; ++a) {
#pragma unroll
      for (int h = 0; h < 2; ++h) one[a][h] = load_stream(wr[a][h] + slice * 4);
    }
    compute(one, slice);
  }
  // Accumulator c0, c1: weight row g, activation columns 2 t4, 2 t4 + 1; c2, c3: row g + 8.
#pragma unroll
  for (int a = 0; a < kA; ++a) {
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      float* p = partial[warp][a][t];
      p[g * 8 + 2 * t4] = acc[a][t][0];
      p[g * 8 + 2 * t4 + 1] = acc[a][t][1];
      p[(g + 8) * 8 + 2 * t4] = acc[a][t][2];
      p[(g + 8) * 8 + 2 * t4 + 1] = acc[a][t][3];
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < kBlockOut * kT * 8; i += kWarps * 32) {
    const int f = i % kBlockOut, r = i / kBlockOut;
    const int feature = base + f;
    if (r >= rows || feature >= out) continue;
    const int a = kEpi == kPlain ? f / 16 : 0;
    const int cell = (f % 16) * 8 + r % 8;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) sum += partial[k][a][r / 8][cell];
    if constexpr (kEpi != kPlain) {
      float up = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) up += partial[k][1][r / 8][cell];
      sum = gate_activation(sum, kEpi == kGeluMul) * up;
    }
    y[static_cast<int64_t>(r) * out + feature] = sum;
  }
}

int multiprocessors() {
  static const int sms = [] {
    int device = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return sms;
}

template <int kT, typename TX, int kEpi>
void launch_tiles(const void* w, const TX* x, float* y, int rows, int in, int out, cudaStream_t s) {
  const auto* wp = static_cast<const uint4*>(w);
  const dim3 threads(kWarps * 32);
  if constexpr (kEpi != kPlain) {
    const auto blocks = static_cast<unsigned>((out + 15) / 16);
    launch_pdl(skinny_kernel<kT, 2, 2, TX, kEpi>, blocks, threads, 0, s, wp, x, y, in, out, rows);
  } else if ((out + 31) / 32 >= 2 * multiprocessors()) {
    // Wide products (lm_head, gate|up unfused): two weight tiles per warp halve the activation
    // reads per weight byte and still leave two blocks per multiprocessor.
    const auto blocks = static_cast<unsigned>((out + 31) / 32);
    launch_pdl(skinny_kernel<kT, 2, 2, TX, kEpi>, blocks, threads, 0, s, wp, x, y, in, out, rows);
  } else {
    const auto blocks = static_cast<unsigned>((out + 15) / 16);
    launch_pdl(skinny_kernel<kT, 1, 4, TX, kEpi>, blocks, threads, 0, s, wp, x, y, in, out, rows);
  }
}

template <typename TX, int kEpi>
void launch(const void* w, const TX* x, float* y, int rows, int in, int out, cudaStream_t s) {
  SPECULA_REQUIRE(rows >= 1 && rows <= kSkinnyMaxRows && skinny_fits(in) && out >= 1,
                  "skinny_gemm: rows " + std::to_string(rows) + ", in " + std::to_string(in) + ", out " +
                      std::to_string(out) + ": rows must be 1..32, in a positive multiple of 32 and out >= 1");
  switch ((rows + 7) / 8) {
    case 1: launch_tiles<1, TX, kEpi>(w, x, y, rows, in, out, s); break;
    case 2: launch_tiles<2, TX, kEpi>(w, x, y, rows, in, out, s); break;
    case 3: launch_tiles<3, TX, kEpi>(w, x, y, rows, in, out, s); break;
    default: launch_tiles<4, TX, kEpi>(w, x, y, rows, in, out, s); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void skinny_gemm(const void* w, const float* x, float* y, int rows, int in, int out, cudaStream_t s) {
  launch<float, kPlain>(w, x, y, rows, in, out, s);
}

void skinny_gemm_xbf16(const void* w, const void* x, float* y, int rows, int in, int out, cudaStream_t s) {
  launch<__nv_bfloat16, kPlain>(w, static_cast<const __nv_bfloat16*>(x), y, rows, in, out, s);
}

void skinny_gemm_gated(const void* w, const float* x, float* y, int rows, int in, int inter, bool gelu,
                       cudaStream_t s) {
  if (gelu) {
    launch<float, kGeluMul>(w, x, y, rows, in, inter, s);
  } else {
    launch<float, kSiluMul>(w, x, y, rows, in, inter, s);
  }
}

}  // namespace specula::cuda_kernels
