// Absorbed MLA attention on the GPU (dense paged and sparse top-k, bf16 and fp8_ds_mla latent
// caches) with split-KV and a combine step. One block computes 64 query rows against tiles of
// 64 latent rows: S = Q K^T over kv_lora_rank + rope dims, then O += P V with V the first
// kv_lora_rank dims of the same tile (MLA's value is part of its key, so a tile is read once).
//
// Rows: dense blocks take 64 consecutive rows of one request's q_len * num_q_heads query rows
// (row = token * num_q_heads + head, the layout of q itself); sparse blocks take 64 heads of one
// token, because all heads of a token share its key list.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

inline constexpr int kMlaBlockRows = 64;
inline constexpr int kMlaBlockKeys = 64;
inline constexpr int kMlaLoraRank = 512;  // the kernels are built for DeepSeek's latent shape
inline constexpr int kMlaRopeDim = 64;

// Whether a token's head blocks come in pairs (num_q_heads a multiple of 128): then dense items 2k
// and 2k + 1 are row blocks 2j and 2j + 1 (one token's heads) of the same request and split, which
// the fp8 kernel runs as a cluster of two blocks sharing their key tiles.
constexpr bool mla_head_blocks_pair(int num_q_heads) { return num_q_heads % (2 * kMlaBlockRows) == 0; }

struct MlaWorkItem {
  int32_t unit;        // dense: request; sparse: token
  int32_t row_block;   // 64-row block within the unit's rows
  int32_t split;       // key split index
  int32_t reserved;
};

struct MlaAttentionParams {
  const void* q;              // bf16 [num_tokens, num_q_heads, 576]
  void* out;                  // bf16 [num_tokens, num_q_heads, 512]
  float* lse;                 // f32 [num_tokens, num_q_heads] natural log, or nullptr
  const uint8_t* cache;       // [num_slots, row_bytes] latent rows
  int32_t fp8;                // 0: bf16 rows (1152 B); 1: fp8_ds_mla rows (656 B)
  int64_t row_bytes;
  int64_t num_slots;          // rows in cache (dense page-64 bf16 steps load whole pages by TMA)
  // Dense.
  const int32_t* page_table;  // [batch_size, max_pages]
  int32_t max_pages;
  int32_t page_size;
  const int32_t* kv_lens;     // [batch_size] keys of each request (queries included)
  const int32_t* q_lens;      // [batch_size]
  const int32_t* first_token; // [batch_size] the request's first query token; query i of a
                              // request sees keys <= kv_len - q_len + i (MLA is always causal)
  const uint64_t* tree_bits;  // [num_tokens] or nullptr: bit a = sees draft token a (the last
                              // q_len keys); every earlier key is visible. q_len <= 64.
  // Sparse.
  const int32_t* slots;       // [num_tokens, topk] global slots, -1 = none; nullptr: dense
  int32_t topk;
  // Both.
  const MlaWorkItem* items;   // dense: [num_items] (sparse items follow from the block index:
                              // token, then head block, then split)
  const int32_t* num_items;   // dense: device count (graph replay may launch fewer live items)
  int32_t max_items;          // grid size
  int32_t num_q_heads;
  int32_t num_splits;         // same for every unit
  int32_t split_align;        // split boundaries are multiples of this (>= kMlaBlockKeys)
  float scale_log2;           // softmax scale * log2(e)
  const float* sinks;         // [num_q_heads] natural-log logits, or nullptr
  // num_splits > 1: partial results, combined by launch_mla_combine.
  float* part_o;              // [num_splits, num_tokens * num_q_heads, 512]
  float* part_lse;            // [num_splits, num_tokens * num_q_heads] log2 domain
  int32_t num_tokens;
};

void launch_mla_attention(const MlaAttentionParams& params, cudaStream_t stream);
// num_splits > 1: merges the splits of every row into out / lse, with sinks.
void launch_mla_combine(const MlaAttentionParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
