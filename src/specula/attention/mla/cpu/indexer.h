// The lightning indexer of sparse MLA (DeepSeek-V3.2) on the CPU: for every query token, the
// relu-weighted multi-head score of each visible key position and the top-k positions. It is
// the oracle the CUDA indexer (cuda/kernels/indexer.h) is tested against; the semantics are
// MlaAttentionBackend::indexer_topk's (mla_backend.h).
#pragma once

#include "specula/core/tensor.h"

namespace specula {

class MLAKVPool;
class ThreadPool;
struct ForwardBatch;

// q [num_tokens, n_heads, index_head_dim] (f32 or bf16) and weights f32 [num_tokens, n_heads],
// contiguous host tensors; out i32 [num_tokens, topk]. Tokens are grouped by request in batch
// order, batch.query_len(r) each; token i of request r sits at KV position
// p = batch.kv_len(r) - batch.query_len(r) + i and scores the keys j in [0, p], read through
// batch.req_to_token_pool from pool.index_buffer(layer_id) (a CPU pool):
//   score[j] = sum_h weights[t][h] * max(q[t][h] . k_j, 0)   (f32; NaN ranks as -inf)
// out[t] lists the min(topk, p + 1) best j, best first, ties to the lower j, then -1.
// Work is split over tokens on `threads`.
void indexer_topk_cpu(const TensorView& q, const TensorView& weights, const MLAKVPool& pool, int layer_id,
                      const ForwardBatch& batch, int topk, const TensorView& out, ThreadPool& threads);

}  // namespace specula
