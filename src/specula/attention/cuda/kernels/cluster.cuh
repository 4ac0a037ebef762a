// Thread-block-cluster primitives (sm_90): a block's rank in its cluster, addresses in a peer
// block's shared memory (distributed shared memory), bulk copies and mbarrier arrivals there, and the
// cluster-wide barrier. A peer's bulk copy has landed once the receiving block's mbarrier phase
// that counts its bytes completes (the plain waits of wgmma.cuh), as with TMA copies.
#pragma once

#include <cstdint>

#include "specula/attention/cuda/kernels/mma.cuh"

namespace specula::cuda_kernels {

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The shared::cluster address of the same byte in block `rank`'s shared memory.
__device__ __forceinline__ uint32_t cluster_map(const void* smem_ptr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_address(smem_ptr)), "r"(rank));
  return out;
}

// Copies `bytes` (a multiple of 16) of this block's shared memory to a peer block's (`dst`, from
// cluster_map) with the bulk-copy engine and counts them on the peer's mbarrier `bar_addr` as
// completed transaction bytes: its phase completes once its expected bytes
// (mbarrier_arrive_expect_tx) have all landed. The source must be visible to the async proxy
// (fence_proxy_async by its writers) and stay unchanged until the peer has consumed the copy.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar_addr) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "r"(smem_address(src)), "r"(bytes), "r"(bar_addr)
      : "memory");
}

// Arrives on this block's mbarrier and adds `bytes` to the transaction bytes its phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// Arrives on an mbarrier of any block of the cluster (address from cluster_map).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar_addr) : "memory");
}

// Makes this thread's mbarrier initialisations visible to the async proxy (TMA and bulk copies that
// complete on them) and to the cluster's other blocks, before the block's or cluster's barrier; a
// block launched without a cluster is a cluster of one.
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Every thread of every block of the cluster arrives and waits.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

}  // namespace specula::cuda_kernels
