// The CPU lightning indexer: argument checks, the token -> (request, KV position) map, and per
// token the f32 scores of its visible keys followed by an exact top-k selection.
#include "specula/attention/mla/cpu/indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "specula/batch/forward_batch.h"
#include "specula/core/error.h"
#include "specula/core/thread_pool.h"
#include "specula/kv/mla_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

namespace {

// q . k in f32 with eight interleaved partial sums: the loop vectorises without -ffast-math, and
// the result is one fixed summation order on every machine. n is a multiple of 16 (the pool's
// index_head_dim rule).
float dot_f32(const float* a, const float* b, int n) {
  float acc[8] = {};
  for (int d = 0; d < n; d += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[d + l] * b[d + l];
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

struct Scratch {
  std::vector<float> q;       // [n_heads, index_head_dim] the token's query as f32
  std::vector<float> key;     // [index_head_dim] one dequantised key
  std::vector<float> scores;  // [p + 1]
  std::vector<int32_t> order;  // [p + 1] positions, best first after selection
};

}  // namespace

void indexer_topk_cpu(const TensorView& q, const TensorView& weights, const MLAKVPool& pool, int layer_id,
                      const ForwardBatch& batch, int topk, const TensorView& out, ThreadPool& threads) {
  const int dim = pool.config().index_head_dim;
  SPECULA_CHECK(dim > 0, "indexer_topk: the MLA KV pool keeps no indexer keys (index_head_dim 0)");
  SPECULA_CHECK(pool.config().device.is_cpu(), "indexer_topk_cpu needs a CPU pool; the pool is on {}",
                pool.config().device.str());
  SPECULA_CHECK(batch.req_to_token_pool != nullptr, "indexer_topk: the batch has no req_to_token_pool");
  SPECULA_CHECK(topk >= 1, "indexer_topk: topk {} must be >= 1", topk);
  SPECULA_CHECK(q.rank() == 3, "indexer_topk: q {} must be [num_tokens, n_heads, index_head_dim]", q.str());
  check_device(q, Device::cpu(), "indexer_topk q");
  SPECULA_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
                "indexer_topk: q dtype {} is not supported; supported: f32, bf16", dtype_name(q.dtype()));
  SPECULA_CHECK(q.is_contiguous(), "indexer_topk: q {} must be contiguous", q.str());
  const int64_t num_tokens = q.size(0);
  const int64_t n_heads = q.size(1);
  SPECULA_CHECK(q.size(2) == dim, "indexer_topk: q {} has head dim {}; the pool's index_head_dim is {}", q.str(),
                q.size(2), dim);
  SPECULA_CHECK(n_heads >= 1, "indexer_topk: q {} has no heads", q.str());
  check_dtype(weights, DType::f32, "indexer_topk weights");
  check_device(weights, Device::cpu(), "indexer_topk weights");
  check_shape(weights, {num_tokens, n_heads}, "indexer_topk weights");
  SPECULA_CHECK(weights.is_contiguous(), "indexer_topk: weights {} must be contiguous", weights.str());
  check_dtype(out, DType::i32, "indexer_topk out");
  check_device(out, Device::cpu(), "indexer_topk out");
  check_shape(out, {num_tokens, topk}, "indexer_topk out");
  SPECULA_CHECK(out.is_contiguous(), "indexer_topk: out {} must be contiguous", out.str());

  const TensorView cache = pool.index_buffer(layer_id);  // checks layer_id
  const int64_t row_bytes = pool.index_row_bytes();
  const int64_t num_slots = pool.num_slots();
  const ReqToTokenPool& req_to_token = *batch.req_to_token_pool;

  // Token -> (request, KV position), in the batch's token order.
  std::vector<int32_t> token_req;
  std::vector<int32_t> token_pos;
  token_req.reserve(static_cast<size_t>(num_tokens));
  token_pos.reserve(static_cast<size_t>(num_tokens));
  SPECULA_CHECK(static_cast<int64_t>(batch.req_pool_indices.size()) == batch.batch_size &&
                    static_cast<int64_t>(batch.seq_lens.size()) == batch.batch_size,
                "indexer_topk: batch of {} requests has {} req_pool_indices and {} seq_lens", batch.batch_size,
                batch.req_pool_indices.size(), batch.seq_lens.size());
  for (int r = 0; r < batch.batch_size; ++r) {
    const int32_t q_len = batch.query_len(r);
    const int32_t kv_len = batch.kv_len(r);
    SPECULA_CHECK(q_len >= 0 && kv_len >= q_len,
                  "indexer_topk: request {} has {} queries but a KV length of {}", r, q_len, kv_len);
    SPECULA_CHECK(kv_len <= req_to_token.max_context_len(),
                  "indexer_topk: request {}: KV length {} exceeds max_context_len {}", r, kv_len,
                  req_to_token.max_context_len());
    const int32_t req_index = batch.req_pool_indices[static_cast<size_t>(r)];
    SPECULA_CHECK(req_index >= 0 && req_index < req_to_token.size(),
                  "indexer_topk: request {}: req_pool_index {} is out of range [0, {})", r, req_index,
                  req_to_token.size());
    for (int32_t i = 0; i < q_len; ++i) {
      token_req.push_back(r);
      token_pos.push_back(kv_len - q_len + i);
    }
  }
  SPECULA_CHECK(static_cast<int64_t>(token_req.size()) == num_tokens,
                "indexer_topk: q has {} tokens but the batch's requests have {} queries", num_tokens,
                token_req.size());

  const auto* cache_bytes = cache.data_as<const uint8_t>();
  const auto* w_all = weights.data_as<const float>();
  auto* out_all = out.data_as<int32_t>();
  const int64_t q_row = n_heads * dim;
  std::vector<Scratch> scratch(static_cast<size_t>(threads.num_threads()));

  threads.parallel_for(num_tokens, [&](int64_t t, int thread_index) {
    Scratch& s = scratch[static_cast<size_t>(thread_index)];
    const int32_t r = token_req[static_cast<size_t>(t)];
    const int32_t n = token_pos[static_cast<size_t>(t)] + 1;  // visible keys [0, n)
    const int32_t* slots = req_to_token.row(batch.req_pool_indices[static_cast<size_t>(r)]);
    s.q.resize(static_cast<size_t>(q_row));
    convert_to_float(static_cast<const uint8_t*>(q.data()) + t * q_row * static_cast<int64_t>(dtype_size(q.dtype())),
                     q.dtype(), s.q.data(), static_cast<size_t>(q_row));
    s.key.resize(static_cast<size_t>(dim));
    s.scores.resize(static_cast<size_t>(n));
    const float* w = w_all + t * n_heads;

    for (int32_t j = 0; j < n; ++j) {
      const int32_t slot = slots[j];
      SPECULA_CHECK(slot >= 0 && slot < num_slots,
                    "indexer_topk: request {} position {} maps to slot {}, outside the pool's [0, {})", r, j, slot,
                    num_slots);
      decode_index_row(cache_bytes + slot * row_bytes, dim, s.key.data());
      float score = 0.0f;
      for (int64_t h = 0; h < n_heads; ++h) {
        const float d = dot_f32(s.q.data() + h * dim, s.key.data(), dim);
        score += w[h] * std::max(d, 0.0f);
      }
      // NaN (only from non-finite inputs) would break the strict weak order below; it ranks last.
      s.scores[static_cast<size_t>(j)] = std::isnan(score) ? -std::numeric_limits<float>::infinity() : score;
    }

    const int32_t k = std::min<int32_t>(topk, n);
    s.order.resize(static_cast<size_t>(n));
    for (int32_t j = 0; j < n; ++j) s.order[static_cast<size_t>(j)] = j;
    const float* sc = s.scores.data();
    const auto better = [sc](int32_t a, int32_t b) { return sc[a] > sc[b] || (sc[a] == sc[b] && a < b); };
    if (k < n) std::nth_element(s.order.begin(), s.order.begin() + k, s.order.end(), better);
    std::sort(s.order.begin(), s.order.begin() + k, better);

    int32_t* o = out_all + t * topk;
    std::copy(s.order.begin(), s.order.begin() + k, o);
    std::fill(o + k, o + topk, -1);
  });
}

}  // namespace specula
