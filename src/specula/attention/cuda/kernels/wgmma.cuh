// Hopper warpgroup primitives (sm_90a): wgmma.mma_async with shared-memory descriptors, the
// fences around it, mbarriers fed by cp.async, and named barriers.
//
// Shared-memory operand tiles use the 128-byte swizzle: a tile of R rows x 64 16-bit columns is R
// rows of 128 bytes whose 16-byte chunk c of row r sits at chunk c ^ (r % 8); wider tiles are
// several such 64-column blocks one after another. Tiles start on 1024-byte boundaries (the
// swizzle repeats every 8 rows), so a descriptor can address any 16-column step of a block by
// adding its byte offset to the start address.
//
// Accumulator fragments of m64nNk16 (f32): warp w of the warpgroup owns rows 16w..16w+15, and
// within the warp d[j][0..3] sit exactly where mma.sync m16n8k16 keeps the C tile of columns
// 8j..8j+7 (mma.cuh), so the online-softmax helpers and the score-to-operand repacking carry over.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "specula/attention/cuda/kernels/mma.cuh"

namespace specula::cuda_kernels {

// Byte offset of element (row, col) of a swizzled tile of `rows` rows (16-bit elements).
__device__ __forceinline__ int swizzled_offset(int rows, int row, int col) {
  return (col >> 6) * rows * 128 + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + (col & 7) * 2;
}

// Descriptor of a 128-byte-swizzled operand. K-major (rows = M or N, 64-column blocks along K):
// the stride between 8-row groups is 1024 bytes and the leading offset is unused. MN-major (the
// operand's rows run along K): `leading` is the byte distance between 64-column blocks of MN.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_addr, uint32_t leading_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(1024u >> 4) << 32) | (1ull << 62);
}

// The descriptor of the operand `bytes` further on in shared memory. Only the start address field
// (bits 0-13, the address / 16) moves, and it cannot carry out: shared addresses stay below 2^18. So
// a loop over k steps adds a constant to one 32-bit word instead of rebuilding the descriptor from
// the address (masks, shifts and moves into uniform registers per wgmma).
__device__ __forceinline__ uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins a register for the compiler: values produced by an asynchronous wgmma must not be read
// before the wait that completes it, nor its inputs reused before then.
template <int kRows>
__device__ __forceinline__ void fence_operands(float (&r)[kRows][4]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
  }
}
template <int kRows>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[kRows][4]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

// Writes of the generic proxy (cp.async, st.shared) become visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Arrives once every cp.async this thread issued so far has landed (counted in the init count).
__device__ __forceinline__ void mbarrier_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Whether the phase of this parity has completed, without waiting (acquires it when it has).
__device__ __forceinline__ bool mbarrier_test_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Moves registers between warpgroups: the block's allocation is fixed, a warpgroup that needs few
// gives them up (dec) and one that holds large fragments takes them (inc).
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Named barriers among `threads` threads (id 0 is __syncthreads').
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The operand lists of m64n16 (8 accumulators), m64n64 (32), m64n128 (64) and m64n256 (128).
#define SPECULA_WGMMA_ACC4(d, i) "+f"((d)[i][0]), "+f"((d)[i][1]), "+f"((d)[i][2]), "+f"((d)[i][3])
#define SPECULA_WGMMA_REGS_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define SPECULA_WGMMA_REGS_32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SPECULA_WGMMA_REGS_64 SPECULA_WGMMA_REGS_32 \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SPECULA_WGMMA_REGS_128 SPECULA_WGMMA_REGS_64 \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
  ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define SPECULA_WGMMA_ACC_8(d) SPECULA_WGMMA_ACC4(d, 0), SPECULA_WGMMA_ACC4(d, 1)
#define SPECULA_WGMMA_ACC_32(d) \
  SPECULA_WGMMA_ACC4(d, 0), SPECULA_WGMMA_ACC4(d, 1), SPECULA_WGMMA_ACC4(d, 2), SPECULA_WGMMA_ACC4(d, 3), \
  SPECULA_WGMMA_ACC4(d, 4), SPECULA_WGMMA_ACC4(d, 5), SPECULA_WGMMA_ACC4(d, 6), SPECULA_WGMMA_ACC4(d, 7)
#define SPECULA_WGMMA_ACC_64(d) \
  SPECULA_WGMMA_ACC_32(d), SPECULA_WGMMA_ACC4(d, 8), SPECULA_WGMMA_ACC4(d, 9), SPECULA_WGMMA_ACC4(d, 10), \
  SPECULA_WGMMA_ACC4(d, 11), SPECULA_WGMMA_ACC4(d, 12), SPECULA_WGMMA_ACC4(d, 13), SPECULA_WGMMA_ACC4(d, 14), \
  SPECULA_WGMMA_ACC4(d, 15)
#define SPECULA_WGMMA_ACC_128(d) \
  SPECULA_WGMMA_ACC_64(d), SPECULA_WGMMA_ACC4(d, 16), SPECULA_WGMMA_ACC4(d, 17), SPECULA_WGMMA_ACC4(d, 18), \
  SPECULA_WGMMA_ACC4(d, 19), SPECULA_WGMMA_ACC4(d, 20), SPECULA_WGMMA_ACC4(d, 21), SPECULA_WGMMA_ACC4(d, 22), \
  SPECULA_WGMMA_ACC4(d, 23), SPECULA_WGMMA_ACC4(d, 24), SPECULA_WGMMA_ACC4(d, 25), SPECULA_WGMMA_ACC4(d, 26), \
  SPECULA_WGMMA_ACC4(d, 27), SPECULA_WGMMA_ACC4(d, 28), SPECULA_WGMMA_ACC4(d, 29), SPECULA_WGMMA_ACC4(d, 30), \
  SPECULA_WGMMA_ACC4(d, 31)

// D (m64 x N) = or += A (m64 x k16, shared memory, K-major) x B (k16 x N, shared memory, K-major);
// scale_d == 0 overwrites D.
template <int N, typename T>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, int scale_d);
// D += A (shared memory, K-major) x B (shared memory, MN-major).
template <int N, typename T>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[N / 8][4], uint64_t a, uint64_t b);
// D += A (registers, the m16n8k16 A layout per warp) x B (shared memory, MN-major).
template <int N, typename T>
__device__ __forceinline__ void wgmma_rs_mn(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b);

#define SPECULA_DEFINE_WGMMA(N, T, PTX_TYPE, REGS, ACC, A_SS, SCALE_SS, A_RS, SCALE_RS)                         \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_ss<N, T>(float (&d)[N / 8][4], uint64_t a, uint64_t b, int scale_d) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE_SS ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " {" REGS "}, " A_SS \
                 ", p, 1, 1, 0, 0;\n}\n"                                                                      \
                 : ACC(d)                                                                                     \
                 : "l"(a), "l"(b), "r"(scale_d));                                                             \
  }                                                                                                           \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_ss_mn<N, T>(float (&d)[N / 8][4], uint64_t a, uint64_t b) {           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE_SS ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " {" REGS "}, " A_SS \
                 ", p, 1, 1, 0, 1;\n}\n"                                                                      \
                 : ACC(d)                                                                                     \
                 : "l"(a), "l"(b), "r"(1));                                                                   \
  }                                                                                                           \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_rs_mn<N, T>(float (&d)[N / 8][4], const uint32_t(&a)[4], uint64_t b) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE_RS ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " {" REGS "}, " A_RS \
                 ", p, 1, 1, 1;\n}\n"                                                                         \
                 : ACC(d)                                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                               \
  }

SPECULA_DEFINE_WGMMA(16, __nv_bfloat16, "bf16", SPECULA_WGMMA_REGS_8, SPECULA_WGMMA_ACC_8, "%8, %9", "%10",
                     "{%8, %9, %10, %11}, %12", "%13")
SPECULA_DEFINE_WGMMA(64, __nv_bfloat16, "bf16", SPECULA_WGMMA_REGS_32, SPECULA_WGMMA_ACC_32, "%32, %33", "%34",
                     "{%32, %33, %34, %35}, %36", "%37")
SPECULA_DEFINE_WGMMA(64, __half, "f16", SPECULA_WGMMA_REGS_32, SPECULA_WGMMA_ACC_32, "%32, %33", "%34",
                     "{%32, %33, %34, %35}, %36", "%37")
SPECULA_DEFINE_WGMMA(128, __nv_bfloat16, "bf16", SPECULA_WGMMA_REGS_64, SPECULA_WGMMA_ACC_64, "%64, %65", "%66",
                     "{%64, %65, %66, %67}, %68", "%69")
SPECULA_DEFINE_WGMMA(128, __half, "f16", SPECULA_WGMMA_REGS_64, SPECULA_WGMMA_ACC_64, "%64, %65", "%66",
                     "{%64, %65, %66, %67}, %68", "%69")
SPECULA_DEFINE_WGMMA(256, __nv_bfloat16, "bf16", SPECULA_WGMMA_REGS_128, SPECULA_WGMMA_ACC_128, "%128, %129",
                     "%130", "{%128, %129, %130, %131}, %132", "%133")

#undef SPECULA_DEFINE_WGMMA
#undef SPECULA_WGMMA_REGS_8
#undef SPECULA_WGMMA_REGS_32
#undef SPECULA_WGMMA_REGS_64
#undef SPECULA_WGMMA_REGS_128
#undef SPECULA_WGMMA_ACC_8
#undef SPECULA_WGMMA_ACC_32
#undef SPECULA_WGMMA_ACC_64
#undef SPECULA_WGMMA_ACC_128
#undef SPECULA_WGMMA_ACC4

}  // namespace specula::cuda_kernels
