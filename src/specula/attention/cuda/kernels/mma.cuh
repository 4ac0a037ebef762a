// Warp-level tensor-core primitives for sm_80+ (used on Hopper until the wgmma mainloop lands):
// ldmatrix (plain and transposed), stmatrix, mma.sync m16n8k16 with f32 accumulators, movmatrix, and
// cp.async 16-byte copies with zero fill.
//
// Fragment layouts of m16n8k16 (lane = 4 * g + t):
//   A (16x16, row-major): a0 (row g, cols 2t..2t+1), a1 (row g+8, same cols),
//                         a2 (row g, cols 2t+8..2t+9), a3 (row g+8, cols 2t+8..2t+9)
//   B (16x8, "col"):      b0 (k rows 2t..2t+1, col g), b1 (k rows 2t+8..2t+9, col g)
//   C (16x8, f32):        c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, cols 2t, 2t+1)
// so the C fragments of two adjacent 8-column tiles are exactly the A fragment of a 16x16 tile:
// scores become P operands without leaving registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace specula::cuda_kernels {

__device__ __forceinline__ uint32_t smem_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}

// Four 8x8 b16 matrices from mma fragments (register i: matrix i, row lane / 4, columns 2 (lane % 4)
// and + 1) into shared memory; lane 8 j + i gives the address of row i of matrix j.
__device__ __forceinline__ void stmatrix_x4(const uint32_t (&r)[4], void* smem_row) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(smem_row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Transposes an 8x8 matrix of 16-bit values held one pair per lane (lane 4 g + t: row g, columns
// 2t, 2t + 1): a C fragment of one 8-row half becomes the B fragment of the transposed tile.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// 16-byte global -> shared copy; with valid == false nothing is read and zeros are written.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* global_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(global_src),
               "r"(valid ? 16 : 0));
}
// An L2 policy for data read once: its lines are the first to go, before anything else.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// The same as cp_async_16 for streamed data: on a miss the L2 fetches the whole 128-byte line
// rather than the chunk's sectors alone, and keeps it under `policy`.
__device__ __forceinline__ void cp_async_16_stream(void* smem_dst, const void* global_src, bool valid,
                                                   uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n"
               :
               : "r"(smem_address(smem_dst)), "l"(global_src), "r"(valid ? 16 : 0), "l"(policy));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace specula::cuda_kernels
