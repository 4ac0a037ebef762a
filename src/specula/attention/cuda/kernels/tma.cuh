// Tensor copies (TMA, sm_90): one box of a tensor map into shared memory, its bytes counted on an
// mbarrier as completed transactions (the receiving side waits with the plain mbarrier waits of
// wgmma.cuh after mbarrier_arrive_expect_tx), and boxes stored back from shared memory. The maps
// come from tensor_map.h.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "specula/attention/cuda/kernels/mma.cuh"

namespace specula::cuda_kernels {

// The box at (x, y) of a 2-D map: x the innermost coordinate, in elements.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_address(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar))
      : "memory");
}

// The box at (x, y) of a 2-D map into the same shared-memory offset of every block of the cluster
// in `mask` (bit i: rank i), each block's mbarrier at bar's offset counting the bytes it receives.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_address(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar)), "h"(mask)
      : "memory");
}

// The box at (x, y, z) of a 3-D map.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int x, int y, int z, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_address(dst)),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_address(bar))
      : "memory");
}

// The box at (x, y) of a 2-D map from shared memory (in the map's swizzle) to global memory, in
// this thread's bulk groups. The writes that filled src must precede it in the async proxy
// (fence_proxy_async, then a barrier between the writers and the issuer).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(map), "r"(x),
               "r"(y), "r"(smem_address(src))
               : "memory");
}

// Closes this thread's bulk stores so far into a group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until this thread's committed bulk stores have read their shared-memory sources (which
// may then be overwritten, or the block exit); their global writes may still be in flight.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

}  // namespace specula::cuda_kernels
