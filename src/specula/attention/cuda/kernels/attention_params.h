// Params of the CUDA attention kernels: raw device pointers with their shapes, plain ints and
// floats. Built once per step by the backend (pointers into its metadata buffers) and per layer
// (tensor pointers and the layer's facts).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct AttentionParams {
  const void* q;             // [num_tokens, num_q_heads, head_dim], io dtype
  int64_t q_stride_token;    // elements
  int64_t q_stride_head;
  void* out;                 // [num_tokens, num_q_heads, v_head_dim], io dtype
  int64_t out_stride_token;
  int64_t out_stride_head;
  float* lse;                // [num_tokens, num_q_heads] natural log, or nullptr
  int64_t lse_stride_token;
  int32_t io_dtype;          // DTypeCode of q and out: kBF16 or kF16
  int32_t out_f32;           // prefill kernels: 1 stores out as f32 instead (partial results to merge)

  const void* k_cache;       // [num_slots, num_kv_heads, head_dim]
  const void* v_cache;       // [num_slots, num_kv_heads, v_head_dim]
  int32_t kv_dtype;          // DTypeCode: kBF16, kF16 or kFp8E4m3
  float k_descale;           // multiplies every K (V) element read; 1 unless fp8
  float v_descale;

  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t v_head_dim;
  int32_t page_size;

  float scale;               // softmax scale on q.k
  const float* seq_score_scale;  // prefill kernels: [num_seqs] multipliers of scale, or nullptr
  float logit_cap;           // > 0: cap * tanh(s / cap)
  int32_t window_left;       // -1: none; else keys j >= pos - window_left
  int32_t causal;            // 1: key j visible to the query at KV index pos iff j <= pos
  int32_t chunk_size;        // decode only: > 0 restricts keys to the query's local chunk
  // Decode only: dual chunk attention (attention/cpu/dual_chunk.h) when > 0, a multiple of 16 (the
  // prefill kernels serve it as passes over virtual sequences: attention/cuda/dual_chunk_plan.h). q
  // then holds each head's intra, successive and inter rotary variants at q + variant * head_dim
  // (q_stride_head >= 3 * head_dim); dca_original_max_position > 0 multiplies a sequence's logits
  // by dual_chunk_logit_scale of its length.
  int32_t dca_chunk_len;
  int32_t dca_original_max_position;
  const float* sinks;        // [num_q_heads] or nullptr
  const uint8_t* custom_mask;  // nullptr, or per sequence [q_len, kv_len] at mask_offsets[seq]

  int32_t num_seqs;
  const int32_t* cu_seqlens_q;  // [num_seqs + 1] query rows of each sequence
  const int32_t* seq_lens_k;    // [num_seqs] KV length of each sequence (queries are its last rows)
  const int32_t* page_table;    // [num_seqs, page_table_stride] page ids
  int32_t page_table_stride;
  const int64_t* mask_offsets;  // [num_seqs] or nullptr
  // Prefill on warpgroup MMA only (prefill_wgmma_supports); nullptr everywhere else.
  const int32_t* kv_row_start;  // [num_seqs] or nullptr: ragged K/V without a page table, key j of
                                // sequence s at row kv_row_start[s] + j of k_cache / v_cache
  int64_t num_kv_rows;          // with kv_row_start: the rows k_cache / v_cache hold
  const int32_t* q_kv_offset;   // [num_seqs] or nullptr: the KV index of each sequence's first query
                                // (may be negative); nullptr: seq_lens_k - q_len (queries last)
  // Prefill: dual chunk attention's sparse runs (kernels/dual_chunk_sparse.h); the mma.sync kernel
  // also skips key tiles that keep nothing for its block. A
  // sequence s with keep_run[s] >= 0 sees key j only where bit key_base[s] + j of its (run, head)
  // column bitmap or bit (q_base[s] + row) - (key_base[s] + j) of its distance bitmap is set
  // (keep_words words per bitmap); keep_run nullptr: no sparse sequences.
  const int32_t* keep_run;
  const int32_t* key_base;
  const int32_t* q_base;
  const uint32_t* keep_cols;
  const uint32_t* keep_dists;
  int64_t keep_words;
};

// Split-KV decode: every (sequence, KV head) is cut into num_splits key ranges computed in the
// kernel from the sequence's length, so one plan (num_splits) serves any lengths: what a CUDA
// graph needs. With num_splits > 1 the partial results go to the workspace, and the last block
// of each (token, head block) to finish (counted in `counters`) merges them.
struct DecodeSplit {
  int32_t num_splits;
  int32_t warps;       // per block: 4, or kDecodeWideWarps when one block per multiprocessor is planned
  float* partial_out;  // [num_splits, num_tokens, num_q_heads, v_head_dim]
  float* partial_lse;  // [num_splits, num_tokens, num_q_heads]
  uint32_t* counters;  // [num_tokens, head groups <= num_q_heads], zero before a launch and after it
  int64_t num_tokens;
};

void launch_decode(const AttentionParams& params, const DecodeSplit& split, cudaStream_t stream);

// Most query heads of one KV head served by one decode block (GQA heads packed so each K/V row is
// read once for all of them); larger groups take several blocks.
inline constexpr int kDecodeHeadsPerBlock = 8;

// Warps of a decode block planned alone on its multiprocessor (few head groups, many splits): one
// wide block keeps as many bytes in flight as two narrow ones, and its warps progress evenly, where
// two narrow blocks sharing a multiprocessor finish their equal key ranges up to 2x apart.
inline constexpr int kDecodeWideWarps = 8;

// Most key splits of one decode (bounds the partial-result buffers the backend sizes).
inline constexpr int kMaxDecodeSplits = 64;

// Prefill / extend / verify: work items of kPrefillTileRows query rows of one sequence, built by
// the backend.
struct PrefillWork {
  const int32_t* items;  // [num_items, 2]: (sequence, first query row of the tile)
  int32_t num_items;
  // The wgmma kernel runs its blocks this many query heads at a time (prefill_head_group), each
  // group's items last to first with its heads fastest; 0: all heads as one group.
  int32_t heads_per_group;
};

// The mma.sync prefill kernel (prefill.cu), for what the wgmma kernel (prefill_wgmma.h) is not
// built for; the backend's selection (select_cuda_extend) picks between them.
void launch_prefill_mma(const AttentionParams& params, const PrefillWork& work, cudaStream_t stream);

// Query rows per prefill work item.
inline constexpr int kPrefillTileRows = 128;

}  // namespace specula::cuda_kernels
