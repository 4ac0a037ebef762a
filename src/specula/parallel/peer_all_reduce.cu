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

// This call's epoch for block b (its previous one + 1), shared by the block.
__device__ __forceinline__ uint32_t block_epoch(const PeerAllReduceArgs& a, int b, uint32_t* shared) {
  if (threadIdx.x == 0) *shared = a.counters[b] + 1;
  __syncthreads();
  return *shared;
}

// After the block's writes to its staging half: thread p < size raises this rank's flag in rank
// p's memory, then waits for rank p's flag in ours (epochs wrap after 2^32 calls: compared by
// difference); the block goes on once every peer's block b has staged its part.
__device__ __forceinline__ void handshake(const PeerAllReduceArgs& a, int b, uint32_t epoch) {
  __syncthreads();
  const int p = static_cast<int>(threadIdx.x);
  if (p < a.size && p != a.rank) {
    store_release_sys(a.flags[p] + a.rank * kPeerMaxBlocks + b, epoch);
    const uint32_t* flag = a.flags[a.rank] + p * kPeerMaxBlocks + b;
    const uint64_t start = global_ns();
    while (static_cast<int32_t>(load_acquire_sys(flag) - epoch) < 0) {
      if (global_ns() - start > static_cast<uint64_t>(kPeerWaitSeconds * 1e9)) __trap();
    }
  }
  __syncthreads();
}

// The sum over ranks, in rank order (every rank gets the same bits), of float4 i of the staging
// halves at `half`.
__device__ __forceinline__ float4 peer_sum(const PeerAllReduceArgs& a, int64_t half, int64_t i) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int p = 0; p < a.size; ++p) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(a.staging[p]) + half + i);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerAllReduceArgs a, float4* data, int64_t count4) {
  __shared__ uint32_t epoch_shared;
  const int b = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const uint32_t epoch = block_epoch(a, b, &epoch_shared);
  const int64_t half = (epoch & 1u) != 0 ? a.capacity / 4 : 0;
  // Slices of whole 512-float4 chunks: a small message occupies the first blocks only.
  const int64_t chunks = (count4 + kThreads - 1) / kThreads;
  const int64_t per = (chunks + gridDim.x - 1) / gridDim.x * kThreads;
  const int64_t begin = per * b;
  const int64_t end = begin + per < count4 ? begin + per : count4;
  float4* mine = reinterpret_cast<float4*>(a.staging[a.rank]) + half;
  for (int64_t i = begin + tid; i < end; i += kThreads) mine[i] = data[i];
  handshake(a, b, epoch);
  for (int64_t i = begin + tid; i < end; i += kThreads) data[i] = peer_sum(a, half, i);
  if (tid == 0) a.counters[b] = epoch;
}

// Every thread gets the block's total (kThreads threads).
__device__ __forceinline__ float block_total(float v, float* partial) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  __syncthreads();  // partial is reused by the next row
  return total;
}

// Rows b, b + gridDim.x, ... are block b's, in the staging copy and in the reduction alike, so a
// block's handshake covers exactly the rows it then reads.
__global__ void __launch_bounds__(kThreads) peer_add_norm_kernel(PeerAllReduceArgs a, const float4* o, int64_t rows,
                                                                  int width4, PeerAddNorm norm) {
  __shared__ uint32_t epoch_shared;
  __shared__ float partial[kThreads / 32];
  const int b = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const uint32_t epoch = block_epoch(a, b, &epoch_shared);
  const int64_t half = (epoch & 1u) != 0 ? a.capacity / 4 : 0;
  float4* mine = reinterpret_cast<float4*>(a.staging[a.rank]) + half;
  for (int64_t r = b; r < rows; r += gridDim.x) {
    for (int i = tid; i < width4; i += kThreads) mine[r * width4 + i] = o[r * width4 + i];
  }
  handshake(a, b, epoch);
  float4* x = reinterpret_cast<float4*>(norm.x);
  const float4* w = reinterpret_cast<const float4*>(norm.w);
  float4* y = reinterpret_cast<float4*>(norm.y);
  const float width = static_cast<float>(width4 * 4);
  for (int64_t r = b; r < rows; r += gridDim.x) {
    float sum = 0.0f;
    for (int i = tid; i < width4; i += kThreads) {
      const float4 acc = peer_sum(a, half, r * width4 + i);
      float4 v = x[r * width4 + i];
      v.x += acc.x;
      v.y += acc.y;
      v.z += acc.z;
      v.w += acc.w;
      x[r * width4 + i] = v;
      if (norm.copy != nullptr) reinterpret_cast<float4*>(norm.copy + r * norm.copy_stride)[i] = v;
      sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float inv = rsqrtf(block_total(sum, partial) / width + norm.eps);
    // Each thread reads back only what it wrote itself.
    for (int i = tid; i < width4; i += kThreads) {
      const float4 v = x[r * width4 + i], g = w[i];
      y[r * width4 + i] = make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
    }
  }
  if (tid == 0) a.counters[b] = epoch;
}

}  // namespace

void peer_all_reduce_add_rms_norm(const PeerAllReduceArgs& args, const float* o, int64_t rows, int width,
                                  const PeerAddNorm& norm, cudaStream_t s) {
  if (rows == 0) return;
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  SPECULA_REQUIRE(width % 4 == 0 && rows * width <= args.capacity && aligned(o) && aligned(norm.x) && aligned(norm.w) &&
                      aligned(norm.y) && (norm.copy == nullptr || (aligned(norm.copy) && norm.copy_stride % 4 == 0)),
                  "peer_all_reduce_add_rms_norm: rows of " + std::to_string(width) +
                      " floats need 16-byte alignment and a width that is a multiple of 4, at most " +
                      std::to_string(args.capacity) + " floats in all");
  peer_add_norm_kernel<<<kPeerMaxBlocks, kThreads, 0, s>>>(args, reinterpret_cast<const float4*>(o), rows, width / 4,
                                                           norm);
  CUDA_CHECK(cudaGetLastError());
}

void preload_peer_kernels() {
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, peer_all_reduce_kernel));
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, peer_add_norm_kernel));
}

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
