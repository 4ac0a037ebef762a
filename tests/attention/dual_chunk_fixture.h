// What the dual chunk attention tests share (dual_chunk_test.cpp, dual_chunk_sparse_test.cpp):
// one CPU-backend forward of a dual chunk layer over random requests on shuffled pages, and the
// float64 pieces of their references (one part's softmax over a set of keys, parts merged by
// their log-sum-exps).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/batch/forward_batch.h"

namespace specula::test {

struct DcaRequest {
  int prefix = 0, len = 0;
  std::vector<float> keys, values;  // [len, kv_heads, head_dim], as the cache holds them
  int64_t first_row = 0;            // the token row of position `prefix`
};

struct DcaRun {
  std::vector<DcaRequest> requests;
  std::vector<float> q;    // [tokens, q_heads, variants * head_dim]
  std::vector<float> out;  // [tokens, q_heads, head_dim]
  std::vector<float> lse;  // [tokens, q_heads]
};

// Requests (cached prefix, new tokens) on shuffled pages of page_size: the prefix is written
// straight into the pool, the new tokens by the step; keys and values uniform in [-1, 1] (rounded
// to the cache's bf16), queries times q_scale with layer.dca_q_variants() variants per head.
// Runs one `mode` forward of `layer` on the CPU backend.
DcaRun run_dual_chunk_layer(const AttentionLayer& layer, ForwardMode mode,
                            const std::vector<std::pair<int, int>>& requests, int page_size, DType kv_dtype,
                            float q_scale, std::mt19937_64& rng);

// One part's softmax over `keys` of r, given their logits: its log-sum-exp and output (head_dim
// values of KV head kv_head).
struct DcaPart {
  double lse = 0;
  std::vector<double> out;
};
DcaPart attend_keys(const std::vector<double>& logits, const std::vector<int>& keys, const DcaRequest& r, int kv_head,
                    int num_kv_heads, int head_dim);
// Parts over disjoint keys merged by their log-sum-exps (at least one part).
DcaPart merge_parts(const std::vector<DcaPart>& parts, int head_dim);

}  // namespace specula::test
