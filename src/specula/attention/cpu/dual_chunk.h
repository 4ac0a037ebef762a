// Dual chunk attention (Qwen2.5-1M's dual_chunk_attention_config; SGLang's dual-chunk
// FlashAttention backend) on the CPU: through the backend's kernels in three passes merged by
// log-sum-exp (dual_chunk_parts.h), or one reference loop over the keys where those cannot serve
// (the sparse prefill pattern, chunks not a whole number of pages).
//
// Positions are split into chunks of chunk_len = chunk_size - local_size tokens. Keys carry the
// rotary position pos % chunk_len; each query comes in three rotary variants (built by the model:
// q is [tokens, heads, 3 * head_dim], variants intra, successive, inter). A query at KV index i
// (chunk i / chunk_len) sees every key j <= i through
//   - the intra variant for keys of its own chunk,
//   - the successive variant for keys of the chunk before,
//   - the inter variant for keys of earlier chunks,
// in one softmax (the same as attending to the three parts apart and merging them by their
// log-sum-exps). With original_max_position > 0 the logits of a request of L keys are also
// multiplied by f(L) = max(1, 0.1 ln(L / original_max_position) + 1): the query's share of the
// long-context temperature; the model multiplies each key by f of its request's length when it
// is written (as vLLM's dual chunk attention does), so a logit carries f(now) f(then).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/cpu/dual_chunk_parts.h"
#include "specula/attention/cpu/tile_kernel.h"

namespace specula {

class ThreadPool;

struct DualChunkShape {
  int chunk_len = 0;
  int original_max_position = 0;
  // Set: q holds five variants per head, and runs of new tokens of sequences longer than its
  // threshold attend sparsely (dual_chunk_sparse.h) when sparse_rows is also set (prefill and
  // extend steps; decode rows always attend densely).
  const DualChunkSparsePattern* sparse = nullptr;
  bool sparse_rows = false;
};

// params.q points at variant 0 of [tokens, heads, V * head_dim] (q_stride_head = V * head_dim,
// V = 3, or 5 with a sparse pattern); params.causal must be set, and window, custom mask and
// sinks unset.
// Without sparse rows and with chunks a whole number of pages, through the backend's kernels
// (dual_chunk_parts.h); otherwise one reference loop per (row, head) over the keys in double.
// parts_plan: the step's plan of the kernel passes, built on the step's first dual chunk layer and
// reused by the others (the backend resets it every step).
void run_dual_chunk_attention(CpuIsa isa, const CpuAttentionParams& params, const DualChunkShape& shape,
                              std::span<const CpuAttentionSeq> seqs, std::optional<DualChunkPassPlan>& parts_plan,
                              std::vector<CpuAttentionScratch>& scratch, ThreadPool& pool);

// The logit multiplier of a request with kv_len keys (1 when original_max_position is 0).
double dual_chunk_logit_scale(int kv_len, int original_max_position);

}  // namespace specula
