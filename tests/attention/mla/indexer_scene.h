// Shared by the lightning-indexer tests (indexer_test.cpp on the CPU, cuda_indexer_test.cpp on
// the GPU): a paged MLA pool holding random indexer keys for a batch of requests (shuffled pages,
// a reserved page 0, different keys in another layer), the ForwardBatch, random queries and
// weights, the float64 reference scores, and the check of a top-k result against them.
//
// The reference is independent of the code under test: keys dequantised by the pool's reader,
// dot products, relu and the weighted head sum in float64, and a full sort.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "specula/batch/forward_batch.h"
#include "specula/core/dtype.h"
#include "specula/core/tensor.h"
#include "specula/core/thread_pool.h"
#include "specula/kv/mla_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula::testing::indexer {

inline constexpr int kLayer = 1;            // keys under test; layer 0 holds different keys
inline constexpr int32_t kPoisonPage = 1 << 28;  // page-table entries past a request's pages

struct SceneSpec {
  ForwardMode mode = ForwardMode::EXTEND;
  std::vector<int> kv_lens;  // per request, after this step
  std::vector<int> q_lens;   // per request (DECODE: 1; TARGET_VERIFY: all equal)
  int page_size = 1;
  int n_heads = 4;
  int dim = 32;
  DType q_dtype = DType::f32;
  int distinct_keys = 0;  // > 0: every key is one of this many vectors (exact score ties)
};

struct Scene {
  SceneSpec spec;
  std::unique_ptr<MLAKVPool> pool;
  std::unique_ptr<ReqToTokenPool> req_to_token;
  ForwardBatch batch;
  Buffer q;        // [num_tokens, n_heads, dim], spec.q_dtype
  Buffer weights;  // f32 [num_tokens, n_heads]
  std::vector<int32_t> token_req, token_pos;    // per token: request (batch index), KV position
  std::vector<std::vector<int32_t>> slots;      // per request: slot of each position
  std::vector<std::vector<int>> key_ids;        // per request: key vector of each position (distinct_keys > 0)
  std::vector<int32_t> page_table;              // [batch_size, max_pages] page ids, kPoisonPage past the end
  int max_pages = 0;
  int max_kv_len = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(token_req.size()); }
};

inline Scene make_scene(const SceneSpec& spec, std::mt19937_64& rng) {
  Scene s;
  s.spec = spec;
  const int bs = static_cast<int>(spec.kv_lens.size());
  const int ps = spec.page_size;
  std::vector<int> pages_of(static_cast<size_t>(bs));
  int total_pages = 1;  // page 0 is reserved (the padding page) and never holds a request's token
  for (int r = 0; r < bs; ++r) {
    pages_of[r] = (spec.kv_lens[r] + ps - 1) / ps;
    total_pages += pages_of[r];
    s.max_pages = std::max(s.max_pages, pages_of[r]);
    s.max_kv_len = std::max(s.max_kv_len, spec.kv_lens[r]);
  }
  s.max_pages = std::max(s.max_pages, 1);

  MLAKVPoolConfig config;
  config.num_slots = static_cast<int64_t>(total_pages) * ps;
  config.num_layers = 2;
  config.kv_lora_rank = 16;  // the latent rows are not used here; keep them small
  config.qk_rope_head_dim = 16;
  config.format = MlaKVFormat::bf16;
  config.index_head_dim = spec.dim;
  s.pool = std::make_unique<MLAKVPool>(config);
  s.req_to_token = std::make_unique<ReqToTokenPool>(bs + 3, std::max(s.max_kv_len, 1));

  std::vector<int32_t> page_ids(static_cast<size_t>(total_pages - 1));
  std::iota(page_ids.begin(), page_ids.end(), 1);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  auto req_indices = s.req_to_token->alloc(bs + 2);
  SPECULA_ASSERT(req_indices.has_value());
  std::shuffle(req_indices->begin(), req_indices->end(), rng);  // batch order != pool order

  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-1.5f, 1.5f);
  const auto random_key = [&](std::vector<float>& key) {
    const float mag = std::exp(log_mag(rng));  // per-row magnitudes, so the fp8 scales differ
    for (float& x : key) x = unit(rng) * mag;
  };
  std::vector<std::vector<float>> vectors(static_cast<size_t>(std::max(spec.distinct_keys, 0)),
                                          std::vector<float>(static_cast<size_t>(spec.dim)));
  for (auto& v : vectors) random_key(v);

  s.page_table.assign(static_cast<size_t>(bs) * static_cast<size_t>(s.max_pages), kPoisonPage);
  s.slots.resize(static_cast<size_t>(bs));
  s.key_ids.resize(static_cast<size_t>(bs));
  size_t next_page = 0;
  std::vector<int32_t> all_slots;
  std::vector<float> keys, other_keys;
  std::vector<float> key(static_cast<size_t>(spec.dim));
  for (int r = 0; r < bs; ++r) {
    for (int i = 0; i < pages_of[r]; ++i) {
      s.page_table[static_cast<size_t>(r) * s.max_pages + i] = page_ids[next_page++];
    }
    auto& slots = s.slots[static_cast<size_t>(r)];
    for (int j = 0; j < spec.kv_lens[r]; ++j) {
      slots.push_back(s.page_table[static_cast<size_t>(r) * s.max_pages + j / ps] * ps + j % ps);
      if (spec.distinct_keys > 0) {
        const int id = std::uniform_int_distribution<int>(0, spec.distinct_keys - 1)(rng);
        s.key_ids[static_cast<size_t>(r)].push_back(id);
        keys.insert(keys.end(), vectors[static_cast<size_t>(id)].begin(), vectors[static_cast<size_t>(id)].end());
      } else {
        random_key(key);
        keys.insert(keys.end(), key.begin(), key.end());
      }
      random_key(key);
      other_keys.insert(other_keys.end(), key.begin(), key.end());
    }
    s.req_to_token->write((*req_indices)[static_cast<size_t>(r)], 0, slots);
    all_slots.insert(all_slots.end(), slots.begin(), slots.end());
  }
  const auto n_keys = static_cast<int64_t>(all_slots.size());
  if (n_keys > 0) {
    s.pool->set_index_k(kLayer, all_slots, TensorView(keys.data(), DType::f32, {n_keys, spec.dim}));
    s.pool->set_index_k(0, all_slots, TensorView(other_keys.data(), DType::f32, {n_keys, spec.dim}));
  }

  ForwardBatch& b = s.batch;
  b.forward_mode = spec.mode;
  b.batch_size = bs;
  b.req_to_token_pool = s.req_to_token.get();
  b.mla_kv_pool = s.pool.get();
  if (spec.mode == ForwardMode::TARGET_VERIFY) {
    auto info = std::make_shared<SpecInfo>();
    info->num_draft_tokens = bs > 0 ? spec.q_lens[0] : 1;
    b.spec_info = info;
  }
  for (int r = 0; r < bs; ++r) {
    const int kv = spec.kv_lens[r];
    const int ql = spec.q_lens[r];
    b.req_pool_indices.push_back((*req_indices)[static_cast<size_t>(r)]);
    b.seq_lens.push_back(spec.mode == ForwardMode::TARGET_VERIFY ? kv - ql : kv);
    if (spec.mode == ForwardMode::EXTEND) {
      b.extend_prefix_lens.push_back(kv - ql);
      b.extend_seq_lens.push_back(ql);
    }
    for (int i = 0; i < ql; ++i) {
      const int pos = kv - ql + i;
      s.token_req.push_back(r);
      s.token_pos.push_back(pos);
      b.positions.push_back(pos);
      b.out_cache_loc.push_back(s.slots[static_cast<size_t>(r)][static_cast<size_t>(pos)]);
      b.input_ids.push_back(1);
    }
  }
  b.validate();

  const int64_t T = s.num_tokens();
  s.q = Buffer(spec.q_dtype, {T, spec.n_heads, spec.dim});
  std::vector<float> qf(static_cast<size_t>(T) * spec.n_heads * spec.dim);
  for (float& x : qf) x = unit(rng);
  convert_from_float(qf.data(), s.q.data(), spec.q_dtype, qf.size());
  s.weights = Buffer(DType::f32, {T, spec.n_heads});
  for (int64_t i = 0; i < T * spec.n_heads; ++i) s.weights.data_as<float>()[i] = unit(rng);
  return s;
}

// Float64 scores of every token over its visible positions [0, p_t], and per token the tolerance
// of the checks: twice a bound on the f32 error of score evaluation (accumulation over dim and
// heads), 2e-5 * max_j sum_h |w_h| sum_d |q_hd k_jd|.
struct Reference {
  std::vector<std::vector<double>> scores;  // [num_tokens][p_t + 1]
  std::vector<double> tol;                  // [num_tokens]
};

inline Reference reference_scores(const Scene& s) {
  const int H = s.spec.n_heads, D = s.spec.dim;
  const int64_t T = s.num_tokens();
  std::vector<std::vector<float>> keys(s.slots.size());
  for (size_t r = 0; r < s.slots.size(); ++r) {
    keys[r].resize(s.slots[r].size() * static_cast<size_t>(D));
    if (!s.slots[r].empty()) s.pool->read_index_rows(kLayer, s.slots[r], keys[r].data());
  }
  std::vector<float> qf(static_cast<size_t>(T) * H * D);
  convert_to_float(s.q.data(), s.q.dtype(), qf.data(), qf.size());
  Reference ref;
  ref.scores.resize(static_cast<size_t>(T));
  ref.tol.resize(static_cast<size_t>(T));
  default_thread_pool().parallel_for(T, [&](int64_t t, int) {
    const auto r = static_cast<size_t>(s.token_req[static_cast<size_t>(t)]);
    const int n = s.token_pos[static_cast<size_t>(t)] + 1;
    const float* w = s.weights.data_as<float>() + t * H;
    auto& out = ref.scores[static_cast<size_t>(t)];
    out.resize(static_cast<size_t>(n));
    double bound = 0.0;
    for (int j = 0; j < n; ++j) {
      const float* k = keys[r].data() + static_cast<size_t>(j) * D;
      double score = 0.0, magnitude = 0.0;
      for (int h = 0; h < H; ++h) {
        const float* q = qf.data() + (static_cast<size_t>(t) * H + h) * D;
        double dot = 0.0, abs_dot = 0.0;
        for (int d = 0; d < D; ++d) {
          const double term = static_cast<double>(q[d]) * static_cast<double>(k[d]);
          dot += term;
          abs_dot += std::fabs(term);
        }
        score += static_cast<double>(w[h]) * std::max(dot, 0.0);
        magnitude += std::fabs(static_cast<double>(w[h])) * abs_dot;
      }
      out[static_cast<size_t>(j)] = score;
      bound = std::max(bound, magnitude);
    }
    ref.tol[static_cast<size_t>(t)] = 2e-5 * bound;
  });
  return ref;
}

// Positions [0, n) best first by reference score, ties to the lower position.
inline std::vector<int32_t> reference_order(const std::vector<double>& scores) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  return order;
}

// Checks one token's top-k row against the reference scores:
//  - min(topk, n) entries, then -1 padding; entries distinct and in [0, n);
//  - the chosen set's scores, sorted, equal the reference's best scores within tol;
//  - best first within tol; the reference's own position wherever its score is separated from the
//    neighbouring reference scores by more than tol;
//  - with key_ids (exact ties: identical keys give identical scores in any implementation):
//    entries of one key vector in ascending position, and the chosen ones the lowest positions.
inline ::testing::AssertionResult check_topk(const std::vector<double>& ref, double tol, const int32_t* row, int topk,
                                             const std::vector<int>* key_ids = nullptr) {
  const int n = static_cast<int>(ref.size());
  const int k = std::min(topk, n);
  const auto fail = [&](const std::string& why) {
    return ::testing::AssertionFailure() << why << " (n " << n << ", topk " << topk << ", tol " << tol << ")";
  };
  std::vector<char> chosen(static_cast<size_t>(n), 0);
  for (int i = 0; i < topk; ++i) {
    if (i >= k) {
      if (row[i] != -1) {
        return fail("entry " + std::to_string(i) + " is " + std::to_string(row[i]) + ", not -1 padding");
      }
      continue;
    }
    if (row[i] < 0 || row[i] >= n) {
      return fail("entry " + std::to_string(i) + " = " + std::to_string(row[i]) + " is not visible");
    }
    if (chosen[static_cast<size_t>(row[i])]) return fail("position " + std::to_string(row[i]) + " is chosen twice");
    chosen[static_cast<size_t>(row[i])] = 1;
  }
  const std::vector<int32_t> order = reference_order(ref);
  std::vector<double> got;
  for (int i = 0; i < k; ++i) got.push_back(ref[static_cast<size_t>(row[i])]);
  std::vector<double> got_sorted = got;
  std::sort(got_sorted.begin(), got_sorted.end(), std::greater<>());
  for (int i = 0; i < k; ++i) {
    const double want = ref[static_cast<size_t>(order[static_cast<size_t>(i)])];
    if (std::fabs(got_sorted[static_cast<size_t>(i)] - want) > tol) {
      return fail("the " + std::to_string(i) + "-th best chosen score " + std::to_string(got_sorted[i]) +
                  " differs from the reference's " + std::to_string(want));
    }
  }
  for (int i = 0; i + 1 < k; ++i) {
    if (got[static_cast<size_t>(i)] < got[static_cast<size_t>(i) + 1] - tol) {
      return fail("entries " + std::to_string(i) + ", " + std::to_string(i + 1) + " (positions " +
                  std::to_string(row[i]) + ", " + std::to_string(row[i + 1]) + ") are not best first: " +
                  std::to_string(got[i]) + " < " + std::to_string(got[i + 1]));
    }
  }
  for (int i = 0; i < k; ++i) {
    const double si = ref[static_cast<size_t>(order[static_cast<size_t>(i)])];
    const bool above_clear = i == 0 || ref[static_cast<size_t>(order[static_cast<size_t>(i) - 1])] - si > tol;
    const bool below_clear = i + 1 >= n || si - ref[static_cast<size_t>(order[static_cast<size_t>(i) + 1])] > tol;
    if (above_clear && below_clear && row[i] != order[static_cast<size_t>(i)]) {
      return fail("entry " + std::to_string(i) + " is position " + std::to_string(row[i]) +
                  "; the reference's clearly separated choice is " + std::to_string(order[i]));
    }
  }
  if (key_ids != nullptr && !key_ids->empty()) {
    const int num_ids = *std::max_element(key_ids->begin(), key_ids->end()) + 1;
    std::vector<int32_t> last_chosen(static_cast<size_t>(num_ids), -1);
    for (int i = 0; i < k; ++i) {
      auto& last = last_chosen[static_cast<size_t>((*key_ids)[static_cast<size_t>(row[i])])];
      if (row[i] < last) {
        return fail("tied positions " + std::to_string(last) + " and " + std::to_string(row[i]) +
                    " (one key vector) are not in ascending order");
      }
      last = row[i];
    }
    for (int x = 0; x < n; ++x) {
      const int32_t last = last_chosen[static_cast<size_t>((*key_ids)[static_cast<size_t>(x)])];
      if (!chosen[static_cast<size_t>(x)] && x < last) {
        return fail("position " + std::to_string(last) + " is chosen over the tied lower position " +
                    std::to_string(x));
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace specula::testing::indexer
