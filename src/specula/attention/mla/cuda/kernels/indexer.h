// The lightning indexer of sparse MLA (DeepSeek-V3.2) on the GPU: for each query token t at KV
// position p_t, score[j] = sum_h weights[t][h] * relu(q[t][h] . k_j) over the visible positions
// j in [0, p_t] (k_j: the fp8 index key of the token's request at position j, dequantised), then
// the topk best j, best first, ties to the lower j, -1 padding. The CPU oracle is
// attention/mla/cpu/indexer.h; for distinct scores the order is the same.
//
// Two phases, each its own kernel (launch_indexer_topk runs both):
//  scores: a block takes one token and 256 keys (4 tiles of 64); the fp8 keys are converted to
//          bf16 exactly (e4m3 fits bf16) and multiplied by the token's bf16 query on tensor cores
//          (mma m16n8k16, f32 accumulators), each key's f32 scale applied to the dot product.
//  select: a block takes one token: an exact radix select over order-preserving u32 keys of the
//          f32 scores, then a bitonic sort of the chosen entries by (score desc, position asc).
// Every launch is graph-capturable: no allocation, no sync; lengths are read on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace specula::cuda_kernels {

inline constexpr int kIndexerHeadDim = 128;   // DeepSeek-V3.2's index_head_dim
inline constexpr int kIndexerMaxTopk = 4096;  // the selected entries are sorted in shared memory

struct IndexerParams {
  const void* q;               // bf16 [num_tokens, n_heads, index_head_dim], contiguous, 4-byte aligned
  const float* weights;        // [num_tokens, n_heads]
  const uint8_t* index_cache;  // [num_slots, index_head_dim + 4]: index_head_dim fp8 e4m3 values, then an f32 scale
  // Position j of request r sits in slot page_table[r * max_pages + j / page_size] * page_size + j % page_size.
  const int32_t* page_table;   // [batch_size, max_pages]
  const int32_t* token_req;    // [num_tokens] each token's request (page_table row)
  const int32_t* token_pos;    // [num_tokens] p_t: the token scores positions [0, p_t]; p_t < max_kv_len
  float* scores;               // workspace f32 [num_tokens, indexer_score_stride(max_kv_len)], 16-byte aligned
  int32_t* out;                // [num_tokens, topk]
  int32_t num_tokens;
  int32_t n_heads;             // 32, 64 or 128
  int32_t index_head_dim;      // kIndexerHeadDim
  int32_t max_pages;
  int32_t page_size;
  int32_t max_kv_len;          // bound on every p_t + 1; sizes the workspace and the grid
  int32_t topk;                // 1 .. kIndexerMaxTopk
};

// Floats per token row of the score workspace (rows start 16-byte aligned for vector loads).
inline int64_t indexer_score_stride(int max_kv_len) { return (static_cast<int64_t>(max_kv_len) + 3) / 4 * 4; }
// Bytes of the score workspace for num_tokens tokens over at most max_kv_len positions.
inline size_t indexer_workspace_bytes(int num_tokens, int max_kv_len) {
  return static_cast<size_t>(num_tokens) * static_cast<size_t>(indexer_score_stride(max_kv_len)) * sizeof(float);
}

// The one selection function: whether a shape is supported, what it needs, which kernels run.
// Reads only the integer fields of params and the index_cache pointer's value.
struct IndexerConfig {
  std::string unsupported;       // empty when supported; else names the value and what is supported
  size_t workspace_bytes = 0;    // indexer_workspace_bytes(num_tokens, max_kv_len)
  int score_warps = 0;           // warps per scores block
  int head_tiles_per_warp = 0;   // 16-head MMA tiles per warp
  // page_size % 64 == 0 and a 16-byte-aligned cache: a 64-key tile is one run of slots, copied in
  // 16-byte vectors; otherwise each key's row is found through the page table and copied in words.
  bool contiguous_tiles = false;
  size_t select_smem_bytes = 0;  // dynamic shared memory of the select kernel
};
IndexerConfig select_indexer(const IndexerParams& params);

// Both phases; throws specula::Error if select_indexer rejects the shape or a pointer is missing.
void launch_indexer_topk(const IndexerParams& params, cudaStream_t stream);
// The phases alone (benchmarks): scores fills the workspace, select reads it and writes out.
void launch_indexer_scores(const IndexerParams& params, cudaStream_t stream);
void launch_indexer_select(const IndexerParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
