// The index conversion kernel: one thread per (token, entry), a grid-stride loop over the
// flattened [num_tokens, topk] array so reads and writes are coalesced. The page-table and
// kv_len reads hit the same few rows across a token's entries and stay in L1.
#include "specula/attention/mla/cuda/kernels/sparse_indices.h"

#include <algorithm>
#include <string>

#include "specula/core/cuda_check.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // enough to fill the GPU; larger arrays loop

__device__ __forceinline__ int32_t convert_one(const SparseIndexParams& p, int32_t req, int32_t idx) {
  if (req < 0 || req >= p.batch_size || idx < 0 || idx >= p.kv_lens[req]) return -1;
  const int32_t page = idx / p.page_size;
  if (page >= p.max_pages) return -1;
  // Formed in 64 bits like the host; slots fit int32 (pools hold at most INT32_MAX slots).
  const int64_t pages_row = static_cast<int64_t>(req) * p.max_pages;
  return static_cast<int32_t>(static_cast<int64_t>(p.page_table[pages_row + page]) * p.page_size + idx % p.page_size);
}

__global__ void convert_kernel(const SparseIndexParams p) {
  const int64_t total = static_cast<int64_t>(p.num_tokens) * p.topk;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t req = p.req_id_per_token[e / p.topk];
    p.out[e] = convert_one(p, req, p.token_indices[e]);
  }
}

}  // namespace

void launch_convert_req_index_to_global_index(const SparseIndexParams& p, cudaStream_t stream) {
  SPECULA_REQUIRE(p.num_tokens >= 0 && p.topk >= 0 && p.batch_size >= 0 && p.max_pages >= 0,
                  "convert_req_index_to_global_index: negative size (num_tokens " + std::to_string(p.num_tokens) +
                      ", topk " + std::to_string(p.topk) + ", batch_size " + std::to_string(p.batch_size) +
                      ", max_pages " + std::to_string(p.max_pages) + ")");
  SPECULA_REQUIRE(p.page_size >= 1, "convert_req_index_to_global_index: page_size " + std::to_string(p.page_size) +
                                        " is not valid; it must be >= 1");
  const int64_t total = static_cast<int64_t>(p.num_tokens) * p.topk;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  convert_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
