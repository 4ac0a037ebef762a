// Tree attention on the GPU: each row (one query token) attends to its sequence's paged prefix
// plus its own list of extra KV slots. The EAGLE draft loop uses it for a frontier row's branch
// (the row's path below the root); TARGET_VERIFY for the tree tokens a verify row may see under
// the tree mask. Raw pointers only; every launch is graph-capturable (no allocation, no sync,
// no host reads) and deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// softmax(scale * q.k) over the union of a sequence's prefix keys and a per-row list of extra KV
// slots (the speculative draft's branch, or the tree tokens a verify row may see).
struct TreeAttentionParams {
  const void* q;        // bf16 [rows, num_q_heads, head_dim], contiguous
  const void* k_cache;  // bf16 or e4m3 (kv_fp8) [num_slots, num_kv_heads, head_dim] (already holds the rows' own K/V)
  const void* v_cache;
  void* out;            // bf16 [rows, num_q_heads, head_dim], contiguous
  int rows;
  int rows_per_seq;     // sequence of row r is r / rows_per_seq
  int num_q_heads, num_kv_heads, head_dim;  // head_dim 64, 128 or 256; num_q_heads a multiple of num_kv_heads
  float scale;
  // Prefix key t of sequence b sits in slot prefix_pages[b * page_stride + t / page_size] * page_size + t % page_size.
  const int32_t* prefix_pages;  // [num_seqs, page_stride]
  int page_stride;
  int page_size;
  const int32_t* prefix_lens;   // [num_seqs]; 0 allowed
  const int32_t* branch_slots;  // [rows, branch_stride]
  int branch_stride;
  int branch_len;               // used when branch_lens is nullptr
  const int32_t* branch_lens;   // [rows] or nullptr: row r sees branch_slots[r * branch_stride + i], i < its length (0 allowed only if prefix_len > 0)
  float* lse;                   // f32 [rows, num_q_heads] at lse_stride_token per row: ln sum exp(scores); or nullptr
  int64_t lse_stride_token;
  // An fp8 e4m3 cache (k_cache and v_cache hold e4m3 bytes; keys are k_descale x the stored
  // value, values v_descale x theirs); bf16 otherwise.
  bool kv_fp8 = false;
  float k_descale = 1.0f, v_descale = 1.0f;
};
// A row with no key at all (prefix and branch both empty) gets zeros (and an LSE of -inf). Per-row lengths are read
// on the device and not checked; they must lie in [0, branch_stride].
void tree_attention(const TreeAttentionParams& p, cudaStream_t s);

}  // namespace specula::cuda_kernels
