// The one-shot peer all-reduce (see peer_all_reduce.h).
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/parallel/peer_all_reduce.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerAllReduceArgs a, float4* data, int64_t count4) {
  __shared__ uint32_t epoch_shared;
  const int b = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) epoch_shared = a.counters[b] + 1;
  __syncthreads();
  const uint32_t epoch = epoch_shared;
  const int64_t half = (epoch & 1u) != 0 ? a.capacity / 4 : 0;
  // Slices of whole 512-float4 chunks: a small message occupies the first blocks only.
  const int64_t chunks = (count4 + kThreads - 1) / kThreads;
  const int64_t per = (chunks + gridDim.x - 1) / gridDim.x * kThreads;
  const int64_t begin = per * b;
  const int64_t end = begin + per < count4 ? begin + per : count4;
  float4* mine = reinterpret_cast<float4*>(a.staging[a.rank]) + half;
  for (int64_t i = begin + tid; i < end; i += kThreads) mine[i] = data[i];
  __syncthreads();
  // Thread p < size talks to rank p: raise our flag in its memory, then wait for its flag in ours.
  if (tid < a.size && tid != a.rank) {
    store_release_sys(a.flags[tid] + a.rank * kPeerMaxBlocks + b, epoch);
    const uint32_t* flag = a.flags[a.rank] + tid * kPeerMaxBlocks + b;
    const uint64_t start = global_ns();
    // Epochs wrap after 2^32 calls: compare by difference.
    while (static_cast<int32_t>(load_acquire_sys(flag) - epoch) < 0) {
      if (global_ns() - start > static_cast<uint64_t>(kPeerWaitSeconds * 1e9)) __trap();
    }
  }
  __syncthreads();
  for (int64_t i = begin + tid; i < end; i += kThreads) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p = 0; p < a.size; ++p) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(a.staging[p]) + half + i);
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    data[i] = acc;
  }
  if (tid == 0) a.counters[b] = epoch;
}

}  // namespace

void peer_all_reduce(const PeerAllReduceArgs& args, float* data, int64_t count, cudaStream_t s) {
  if (count == 0) return;
  SPECULA_REQUIRE(count % 4 == 0 && count <= args.capacity && (reinterpret_cast<uintptr_t>(data) & 15) == 0,
                  "peer_all_reduce: " + std::to_string(count) +
                      " floats; it needs a 16-byte aligned multiple of 4 of at most " + std::to_string(args.capacity));
  const int64_t count4 = count / 4;
  // Always every block, whatever the message: each block's epoch and staging half then move in
  // step with every other's, so a rank's next write to a half always follows the peers' whole
  // previous call (a block idle in one call and busy in the next could otherwise overwrite a half
  // a peer is still reading). Blocks past the message only take part in the handshake.
  peer_all_reduce_kernel<<<kPeerMaxBlocks, kThreads, 0, s>>>(args, reinterpret_cast<float4*>(data), count4);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
