// Sparse MLA's index conversion on the GPU (vLLM's triton_convert_req_index_to_global_index):
// request-relative top-k positions -> global KV slots through the page table. The rule is
// sparse_indices.h's (attention/mla), and the host version there gives the same integers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct SparseIndexParams {
  const int32_t* req_id_per_token;  // [num_tokens] row of page_table / kv_lens
  const int32_t* page_table;        // [batch_size, max_pages]
  const int32_t* kv_lens;           // [batch_size]
  const int32_t* token_indices;     // [num_tokens, topk] request-relative positions, -1 pads
  int32_t* out;                     // [num_tokens, topk] global slots or -1 (may not alias token_indices)
  int32_t num_tokens;
  int32_t topk;
  int32_t batch_size;
  int32_t max_pages;
  int32_t page_size;                // >= 1
};

// out[t][i] = page_table[req][idx / page_size] * page_size + idx % page_size, req =
// req_id_per_token[t], idx = token_indices[t][i]; -1 when idx < 0, idx >= kv_lens[req] or
// idx / page_size >= max_pages, and (the host version throws instead) when req is outside
// [0, batch_size). Graph-capturable: no allocation, no sync. Launched with PDL (core/cuda_pdl.cuh):
// req_id_per_token, kv_lens and page_table are read before waiting for the kernel launched just
// before, so they must be step metadata, written before that kernel; token_indices may be its output.
void launch_convert_req_index_to_global_index(const SparseIndexParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
