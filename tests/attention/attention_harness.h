// A test harness for attention backends: builds a paged KV cache (shuffled pages) with a
// random cached prefix per request, a ForwardBatch for the chosen mode, random q/k/v for the
// new tokens, runs a backend, and computes the naive references for the same inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "attention/reference_attention.h"

namespace specula::testing {

struct RequestSpec {
  int prefix_len = 0;  // cached tokens (DECODE: seq_len - 1; TARGET_VERIFY: committed tokens)
  int extend_len = 1;  // new tokens (DECODE: 1; TARGET_VERIFY: num_draft_tokens)
};

struct HarnessConfig {
  ForwardMode mode = ForwardMode::EXTEND;
  std::vector<RequestSpec> requests;
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 64;
  int v_head_dim = 0;
  int page_size = 1;
  DType q_dtype = DType::f32;  // q, k, v and output
  DType kv_dtype = DType::f32;
  float scaling = 0.0f;
  float logit_cap = 0.0f;
  int window_left = -1;
  bool causal = true;
  bool sinks = false;
  int chunk_size = 0;  // > 0: local attention layer with this attention_chunk_size
  bool tree_mask = false;  // TARGET_VERIFY with random EAGLE-style tree masks
  bool hide_first_draft_row = false;  // tree masks: draft token 0 sees nothing at all
  bool prefix_visible = false;        // tree masks: set SpecInfo::prefix_visible (they do show the prefix)
  float k_scale = 1.0f;  // fp8 pools
  float v_scale = 1.0f;
  // > 0: a dual chunk attention layer (attention/cpu/dual_chunk.h): q holds three rotary variants
  // per head, and the reference attends to the three parts apart and merges them by their LSEs.
  int dca_chunk_len = 0;
  int dca_original_max = 0;
  // With dca_chunk_len: the sparse prefill pattern (q then holds five variants). The reference
  // does not model it: compare backends with each other (the CPU's is tested against float64).
  std::shared_ptr<const DualChunkSparsePattern> dca_sparse;
};

struct AttentionResult {
  std::vector<double> out;  // [num_tokens, num_q_heads, v_head_dim], decoded to double
  std::vector<double> lse;  // [num_tokens, num_q_heads]
};

class AttentionHarness {
 public:
  AttentionHarness(const HarnessConfig& config, uint64_t seed);

  const HarnessConfig& config() const { return config_; }
  const AttentionLayer& layer() const { return layer_; }
  AttentionBackendOptions backend_options() const;

  // Runs the backend on the whole batch (or only the listed requests, as their own batch).
  AttentionResult run(AttentionBackend& backend, const std::vector<int>& only = {});
  // The naive reference in precision T, over the same requests; output rounded to the output
  // dtype as a real implementation of that precision would.
  template <typename T>
  AttentionResult reference(const std::vector<int>& only = {}, bool round_probs = false) const;
  // Runs a backend on `device`: the KV pool (prefix included) is mirrored there first, the
  // inputs uploaded, the outputs fetched back. CPU devices use run().
  AttentionResult run_on_device(AttentionBackend& backend, Device device, const std::vector<int>& only = {});

  std::vector<int> all_requests() const;

 private:
  ForwardBatch make_batch(const std::vector<int>& requests) const;
  // Elements of one head's q: three rotary variants under dual chunk attention.
  int q_width() const { return (config_.dca_chunk_len > 0 ? (config_.dca_sparse ? 5 : 3) : 1) * config_.head_dim; }
  template <typename T>
  void dual_chunk_reference(ReferenceLayer rl, const std::vector<double>& q, const std::vector<double>& k,
                            const std::vector<double>& v, const std::vector<uint8_t>& mask, const RequestSpec& spec,
                            bool round_probs, std::vector<double>& out, std::vector<double>& lse) const;
  AttentionResult run_with(AttentionBackend& backend, MHAKVPool& pool, Device device, const std::vector<int>& only);

  HarnessConfig config_;
  AttentionLayer layer_;
  std::unique_ptr<ReqToTokenPool> req_pool_;
  std::unique_ptr<MHAKVPool> kv_pool_;
  std::vector<std::vector<int32_t>> token_slots_;   // per request: slot of every token
  std::vector<std::vector<float>> new_q_, new_k_, new_v_;  // per request, already rounded to q_dtype
  std::vector<std::vector<uint8_t>> tree_masks_;    // per request [extend_len, prefix + extend]
};

// A fresh 64-bit seed per call (tests print it on failure), and `count` requests with random
// prefix lengths in [0, max_prefix] and extend lengths in [1, max_extend] (1 for DECODE).
uint64_t fresh_seed();
std::vector<RequestSpec> random_requests(std::mt19937& rng, int count, int max_prefix, int max_extend, ForwardMode mode);

// Asserts the backend's error is within 2x the naive same-precision reference's error plus
// atol (FlashAttention's rule), that -inf LSE positions match, and LSEs agree.
void expect_close_to_reference(const AttentionResult& got, const AttentionResult& truth,
                               const AttentionResult& naive, double atol, const char* what);

}  // namespace specula::testing
