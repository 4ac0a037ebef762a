// Double sparsity test harness: a paged KV cache on shuffled pages filled by a prefill through
// the backend, one decode step, and the float64 reference that redoes the label scores, the
// heavy-token choice and the attention from the raw inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/double_sparsity/ds_config.h"

namespace specula::testing {

struct DsCase {
  std::vector<int> lens;  // each request's context after the decode token
  int num_q_heads = 8, num_kv_heads = 2, head_dim = 64, page_size = 1;
  DType q_dtype = DType::f32, kv_dtype = DType::f32;
  int heavy_channel_num = 16, heavy_token_num = 64, threshold = 256;
  float logit_cap = 0.0f;
  bool sinks = false;
  // Every key holds one value at the label channels: all label scores tie, and the choice is
  // the lowest positions.
  bool tied_labels = false;
  // The harness writes each step's K and V into the pool itself and calls the backend with
  // save_kv_cache = false, as the GPU models (fused QKV epilogue) do.
  bool caller_writes_kv = false;
  double min_margin = 1e-4;  // a draw's heavy-token choice must clear this (see selection_margin)
  // Decode steps after the prefill; the last one is checked (the ones before write K and labels
  // through the decode path, sparse or dense).
  int decode_steps = 1;
  // > 0: each token's label channels (per KV head) copy one of this many rows, so label scores
  // tie in groups and the heavy-token count usually ends inside a group (ties to the lower
  // position there); the other channels stay random.
  int label_groups = 0;
};

struct DsResult {
  std::vector<double> out;  // [requests, num_q_heads, head_dim]
  std::vector<double> lse;  // [requests, num_q_heads]
};

class DsHarness {
 public:
  DsHarness(const DsCase& c, uint64_t seed);

  // The prefill (lens - 1 tokens each) and the decode through backend_name wrapped in double
  // sparsity, on device; the decode's output.
  DsResult run(const std::string& backend_name, Device device) const;
  // Float64: sparse rows attend to their reference choice; `all_keys` makes every row dense.
  DsResult reference(bool all_keys = false) const;
  // The smallest gap between the heavy_token_num-th and the next label score of any sparse row,
  // relative to that row's largest |score| (a choice closer than rounding can be either way).
  // When the count ends inside a group of equal scores (label_groups), the gaps from that group
  // to the nearest different scores above and below it.
  double selection_margin() const;
  bool any_sparse_row() const;
  const DoubleSparsityConfig& config() const { return *config_; }

 private:
  std::vector<int> chosen_keys(int request, int kv_head) const;
  std::vector<double> label_scores(int request, int kv_head) const;
  bool row_sparse(int request) const;

  DsCase c_;
  std::shared_ptr<DoubleSparsityConfig> config_;
  AttentionLayer layer_;
  std::vector<std::vector<int32_t>> slots_;  // per request, every token's slot
  std::vector<std::vector<float>> k_, v_;    // per request [len, kv_heads, head_dim], pool-rounded
  std::vector<std::vector<float>> prefill_q_;
  std::vector<float> decode_q_;              // [requests, q_heads, head_dim], q-rounded
  int64_t num_slots_ = 0;
};

// A harness whose sparse rows' choice clears c.min_margin (drawn again otherwise, up to 50
// times), or nullptr; seed gets the seed it was drawn with.
std::unique_ptr<DsHarness> harness_with_clear_choice(const DsCase& c, uint64_t& seed);

// max |a - b| (infinity when the sizes differ).
double max_diff(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace specula::testing
