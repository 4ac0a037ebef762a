// The index conversion kernel: a block per (token, run of 1024 entries), four consecutive entries
// a thread. The token's request, its kv_len and its page-table row are looked up once per block
// and before pdl_wait (step metadata), so after the wait each thread is one index load (16 bytes
// when topk is a multiple of four) and its page-table loads away from its store. The kernel sits
// on the critical path of every sparse attention call: one thread per entry with the request
// looked up per entry measured 6.2-6.6 us of a 341 us call (B=128, q_len 2, topk 2048, H200).
#include "specula/attention/mla/cuda/kernels/sparse_indices.h"

#include <cstdint>
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 4;
constexpr int kPerBlock = kThreads * kPerThread;

struct TokenRow {
  const int32_t* pages;  // the request's page-table row
  int32_t kv_len;        // 0 for a request outside the batch: every entry gives -1
};

__device__ __forceinline__ int32_t convert_one(const SparseIndexParams& p, const TokenRow& r, int32_t idx) {
  if (idx < 0 || idx >= r.kv_len) return -1;
  const int32_t page = idx / p.page_size;
  if (page >= p.max_pages) return -1;
  // Formed in 64 bits like the host; slots fit int32 (pools hold at most INT32_MAX slots).
  return static_cast<int32_t>(static_cast<int64_t>(r.pages[page]) * p.page_size + idx % p.page_size);
}

// kVector: topk is a multiple of four and both arrays are 16-byte aligned.
template <bool kVector>
__global__ void __launch_bounds__(kThreads) convert_kernel(const SparseIndexParams p, int runs) {
  const int64_t token = blockIdx.x / runs;
  const int first = (blockIdx.x % runs) * kPerBlock;
  const int32_t req = p.req_id_per_token[token];
  const bool in_batch = req >= 0 && req < p.batch_size;
  const TokenRow r{p.page_table + (in_batch ? static_cast<int64_t>(req) * p.max_pages : 0),
                   in_batch ? p.kv_lens[req] : 0};
  // The indices (and the slots the previous attention call read) belong to the kernels before.
  pdl_wait();
  pdl_trigger();
  const int64_t row = token * p.topk;
  if constexpr (kVector) {
    const int i = first + threadIdx.x * kPerThread;
    if (i >= p.topk) return;
    const int4 idx = *reinterpret_cast<const int4*>(p.token_indices + row + i);
    const int4 out = make_int4(convert_one(p, r, idx.x), convert_one(p, r, idx.y), convert_one(p, r, idx.z),
                               convert_one(p, r, idx.w));
    *reinterpret_cast<int4*>(p.out + row + i) = out;
  } else {
    const int end = min(p.topk, first + kPerBlock);
    for (int i = first + threadIdx.x; i < end; i += kThreads) {
      p.out[row + i] = convert_one(p, r, p.token_indices[row + i]);
    }
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
  if (p.num_tokens == 0 || p.topk == 0) return;
  const int runs = (p.topk + kPerBlock - 1) / kPerBlock;
  const int64_t blocks = static_cast<int64_t>(p.num_tokens) * runs;
  SPECULA_REQUIRE(blocks <= INT32_MAX, "convert_req_index_to_global_index: " + std::to_string(p.num_tokens) +
                                           " tokens x topk " + std::to_string(p.topk) + " is too large a grid");
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool vector = p.topk % kPerThread == 0 && aligned(p.token_indices) && aligned(p.out);
  launch_pdl(vector ? convert_kernel<true> : convert_kernel<false>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
             0, stream, p, runs);
}

}  // namespace specula::cuda_kernels
