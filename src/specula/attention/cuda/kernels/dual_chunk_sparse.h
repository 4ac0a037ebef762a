// Dual chunk attention's sparse prefill pattern on the GPU (attention/cpu/dual_chunk_sparse.h is
// the definition and the reference): for each sparse run and query head, the run's last queries
// (at most kMaxSparseEstimators) score every key up to their position in one softmax each (the
// key's chunk picks the q variant: 0 in the run's chunk, 3 in the one before, 4 earlier); the
// probabilities summed per key column and per distance give the vertical and slash scores; the
// first forced_vertical columns and the forced_slash nearest distances rank first; each head keeps
// its top vertical[h] columns and slash[h] distances (ties: the lower index) as two bitmaps, which
// the prefill kernels then apply (AttentionParams::keep_*).
//
// Four launches: partial log-sum-exps per key block, their merge, the probabilities summed (slash
// sums through float atomics, so their last bits depend on the order blocks finish), and an exact
// radix top-k per (run, head, columns | distances).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

inline constexpr int kMaxSparseEstimators = 64;
inline constexpr int kSparseKeyBlock = 256;  // keys per block of the scoring kernels

// One sparse run: int32 fields, in this order.
enum SparseRunField : int {
  kRunToken,      // q row (token index) of the first estimating query
  kRunFirstPos,   // its KV position; the others follow it
  kRunCount,      // estimating queries, 1 .. kMaxSparseEstimators
  kRunEnd,        // keys [0, end): the run's last position + 1
  kRunChunk,      // the run's chunk
  kRunPageRow,    // the row of `pages` that holds the sequence's page table
  kSparseRunFields
};

struct DualChunkSparseParams {
  const void* q;  // [tokens, num_q_heads, 5 * head_dim]: the five variants per head
  int64_t q_stride_token;
  int64_t q_stride_head;
  int32_t q_dtype;  // kBF16 or kF16
  const void* k_cache;
  int32_t kv_dtype;
  float k_descale;
  int32_t num_q_heads, num_kv_heads, head_dim, page_size, chunk_len;
  float scale;      // softmax scale (the run's temperature multiplies it)
  float logit_cap;  // > 0: soft-cap
  int32_t num_runs;
  const int32_t* runs;       // [num_runs, kSparseRunFields]
  const float* temperature;  // [num_runs]
  const int32_t* pages;      // [rows, page_stride]
  int32_t page_stride;
  const int32_t* keep_vertical;  // [num_q_heads] columns kept
  const int32_t* keep_slash;     // [num_q_heads] distances kept
  int32_t forced_vertical, forced_slash;
  int32_t max_end;  // the longest run's end: the stride of the score rows
  // Workspace, sized by dual_chunk_sparse_workspace.
  float* partial;   // [num_runs, num_q_heads, key blocks, kMaxSparseEstimators, 2]
  float* lse;       // [num_runs, num_q_heads, kMaxSparseEstimators]
  float* vertical;  // [num_runs, num_q_heads, max_end]
  float* slash;     // [num_runs, num_q_heads, max_end]
  // Results: [num_runs, num_q_heads, keep_words(max_end)] bitmaps.
  uint32_t* keep_cols;
  uint32_t* keep_dists;
};

inline int64_t keep_words(int64_t max_end) { return (max_end + 31) / 32; }
// Floats of `partial`, `lse`, and of `vertical` (= of `slash`).
void dual_chunk_sparse_workspace(int num_runs, int num_q_heads, int max_end, int64_t& partial, int64_t& lse,
                                 int64_t& scores);

void launch_dual_chunk_sparse_select(const DualChunkSparseParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
