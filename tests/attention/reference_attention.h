// The naive attention reference: for one request, materialise the full [q_len, kv_len] mask
// from the definitions of each variant, then softmax(scale * q.k^T) v in precision T (double
// for the truth, float for "a naive implementation of the same precision"). It shares no code
// with the backends: no page tables, no tiles, no online softmax.
#pragma once

#include <cstdint>
#include <vector>

namespace specula::testing {

struct ReferenceLayer {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;
  double scale = 0;
  double logit_cap = 0;
  std::vector<float> sinks;  // empty or [num_q_heads]
};

// Visibility of key j for the query at KV position `pos` under each rule.
struct MaskRules {
  bool causal = true;
  int window_left = -1;
  int chunk_size = 0;  // local attention
};
// [q_len, kv_len] row-major, query i at position q_kv_offset + i; custom (if non-empty) is ANDed.
std::vector<uint8_t> reference_mask(const MaskRules& rules, int q_len, int kv_len, int q_kv_offset,
                                    const std::vector<uint8_t>& custom);

// q: [q_len, num_q_heads, head_dim]; k: [kv_len, num_kv_heads, head_dim];
// v: [kv_len, num_kv_heads, v_head_dim]; out: [q_len, num_q_heads, v_head_dim]; lse:
// [q_len, num_q_heads] (natural log, sinks included; -inf for rows that see nothing).
// round_probs: when true, each unnormalised probability is rounded to bf16 before it multiplies
// V, as a tensor-core implementation of bf16 attention does (FlashAttention's tests compare
// against such a same-precision reference).
template <typename T>
void reference_attention(const ReferenceLayer& layer, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<uint8_t>& mask, int q_len, int kv_len,
                         std::vector<double>& out, std::vector<double>& lse, bool round_probs = false);

}  // namespace specula::testing
