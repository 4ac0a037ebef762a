// indexer_topk_cpu (attention/mla/cpu/indexer.h) against the float64 reference of
// indexer_scene.h: random batches in EXTEND (multi-token causal, with and without a cached
// prefix), DECODE and TARGET_VERIFY; f32 and bf16 queries; page sizes 1 and 64; topk above and
// below the visible counts (padding); DeepSeek's head shape; exact ties (identical keys) going to
// the lower position; batched == per request == any thread count; argument errors. Fresh random
// inputs every run; the seed is printed on failure.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "indexer_scene.h"
#include "specula/attention/mla/cpu/indexer.h"
#include "specula/core/error.h"
#include "specula/core/thread_pool.h"

namespace specula::testing::indexer {
namespace {

uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

std::vector<int32_t> run_cpu(const Scene& s, int topk, ThreadPool& threads) {
  Buffer out(DType::i32, {s.num_tokens(), topk});
  indexer_topk_cpu(s.q, s.weights, *s.pool, kLayer, s.batch, topk, out, threads);
  return {out.data_as<int32_t>(), out.data_as<int32_t>() + out.numel()};
}

void expect_matches_reference(const Scene& s, int topk, const std::vector<int32_t>& out, bool exact_ties) {
  const Reference ref = reference_scores(s);
  for (int64_t t = 0; t < s.num_tokens(); ++t) {
    const auto r = static_cast<size_t>(s.token_req[static_cast<size_t>(t)]);
    EXPECT_TRUE(check_topk(ref.scores[static_cast<size_t>(t)], ref.tol[static_cast<size_t>(t)],
                           out.data() + t * topk, topk, exact_ties ? &s.key_ids[r] : nullptr))
        << "token " << t << " (request " << r << ", position " << s.token_pos[static_cast<size_t>(t)] << ")";
  }
}

// Random requests of a mode: EXTEND mixes a request with no cached prefix, one with a long
// prefix and a single new token, and random ones; TARGET_VERIFY uses 3 draft tokens.
SceneSpec random_spec(ForwardMode mode, std::mt19937_64& rng) {
  SceneSpec spec;
  spec.mode = mode;
  const int bs = uniform(rng, 2, 4);
  for (int r = 0; r < bs; ++r) {
    int q_len = 1;
    if (mode == ForwardMode::EXTEND) q_len = r == 1 ? 1 : uniform(rng, 1, 6);
    if (mode == ForwardMode::TARGET_VERIFY) q_len = 3;
    const int min_prefix = mode == ForwardMode::DECODE ? 0 : 1;
    const int prefix = mode == ForwardMode::EXTEND && r == 0 ? 0 : uniform(rng, min_prefix, 260);
    spec.kv_lens.push_back(prefix + q_len);
    spec.q_lens.push_back(q_len);
  }
  return spec;
}

TEST(CpuIndexer, RandomBatchesMatchFloat64Reference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool threads(3);
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE, ForwardMode::TARGET_VERIFY}) {
    for (DType q_dtype : {DType::f32, DType::bf16}) {
      for (int page_size : {1, 64}) {
        for (int trial = 0; trial < 3; ++trial) {
          SceneSpec spec = random_spec(mode, rng);
          spec.q_dtype = q_dtype;
          spec.page_size = page_size;
          const Scene s = make_scene(spec, rng);
          for (int topk : {1, 7, 48}) {
            SCOPED_TRACE(std::string(forward_mode_name(mode)) + " q " + std::string(dtype_name(q_dtype)) +
                         " page_size " + std::to_string(page_size) + " topk " + std::to_string(topk));
            expect_matches_reference(s, topk, run_cpu(s, topk, threads), /*exact_ties=*/false);
          }
        }
      }
    }
  }
}

TEST(CpuIndexer, DeepSeekHeadShapeMatchesFloat64Reference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool threads(4);
  SceneSpec spec;
  spec.mode = ForwardMode::EXTEND;
  spec.kv_lens = {uniform(rng, 120, 200), 20, uniform(rng, 60, 90)};
  spec.q_lens = {3, 20, 1};  // the second request is a fresh prefill: causal among its own tokens
  spec.n_heads = 64;
  spec.dim = 128;
  spec.q_dtype = DType::bf16;
  spec.page_size = 64;
  const Scene s = make_scene(spec, rng);
  for (int topk : {16, 64}) {
    SCOPED_TRACE("topk " + std::to_string(topk));
    expect_matches_reference(s, topk, run_cpu(s, topk, threads), /*exact_ties=*/false);
  }
}

TEST(CpuIndexer, TiesGoToTheLowerPosition) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool threads(3);
  for (int page_size : {1, 64}) {
    SceneSpec spec;
    spec.mode = ForwardMode::EXTEND;
    spec.kv_lens = {uniform(rng, 150, 250), uniform(rng, 5, 40)};
    spec.q_lens = {4, 2};
    spec.page_size = page_size;
    spec.distinct_keys = 3;
    const Scene s = make_scene(spec, rng);
    for (int topk : {10, 100, 300}) {
      SCOPED_TRACE("page_size " + std::to_string(page_size) + " topk " + std::to_string(topk));
      expect_matches_reference(s, topk, run_cpu(s, topk, threads), /*exact_ties=*/true);
    }
  }
}

TEST(CpuIndexer, IdenticalKeysSelectPositionsInOrder) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool threads(2);
  SceneSpec spec;
  spec.mode = ForwardMode::DECODE;
  spec.kv_lens = {90, 30};
  spec.q_lens = {1, 1};
  spec.distinct_keys = 1;
  const Scene s = make_scene(spec, rng);
  const int topk = 40;
  const std::vector<int32_t> out = run_cpu(s, topk, threads);
  for (int t = 0; t < 2; ++t) {
    const int visible = s.token_pos[static_cast<size_t>(t)] + 1;
    for (int i = 0; i < topk; ++i) {
      EXPECT_EQ(out[static_cast<size_t>(t * topk + i)], i < visible ? i : -1) << "token " << t << " entry " << i;
    }
  }
}

TEST(CpuIndexer, BatchedEqualsPerRequestAndThreadCountDoesNotMatter) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  SceneSpec spec = random_spec(ForwardMode::EXTEND, rng);
  spec.page_size = 64;
  spec.q_dtype = DType::bf16;
  const Scene s = make_scene(spec, rng);
  const int topk = 32;
  ThreadPool one(1), four(4);
  const std::vector<int32_t> batched = run_cpu(s, topk, four);
  EXPECT_EQ(run_cpu(s, topk, one), batched);
  int64_t first = 0;
  for (int r = 0; r < s.batch.batch_size; ++r) {
    const auto ri = static_cast<size_t>(r);
    const int ql = s.batch.extend_seq_lens[ri];
    ForwardBatch single;
    single.forward_mode = ForwardMode::EXTEND;
    single.batch_size = 1;
    single.req_pool_indices = {s.batch.req_pool_indices[ri]};
    single.seq_lens = {s.batch.seq_lens[ri]};
    single.extend_prefix_lens = {s.batch.extend_prefix_lens[ri]};
    single.extend_seq_lens = {ql};
    single.out_cache_loc.assign(s.batch.out_cache_loc.begin() + first, s.batch.out_cache_loc.begin() + first + ql);
    single.req_to_token_pool = s.req_to_token.get();
    single.mla_kv_pool = s.pool.get();
    Buffer out(DType::i32, {ql, topk});
    indexer_topk_cpu(s.q.view().slice(first, ql), s.weights.view().slice(first, ql), *s.pool, kLayer, single, topk,
                     out, one);
    const std::vector<int32_t> alone(out.data_as<int32_t>(), out.data_as<int32_t>() + out.numel());
    const std::vector<int32_t> in_batch(batched.begin() + first * topk, batched.begin() + (first + ql) * topk);
    EXPECT_EQ(alone, in_batch) << "request " << r;
    first += ql;
  }
}

TEST(CpuIndexer, RejectsBadArguments) {
  std::mt19937_64 rng(fresh_seed());
  SceneSpec spec;
  spec.mode = ForwardMode::DECODE;
  spec.kv_lens = {10, 12};
  spec.q_lens = {1, 1};
  const Scene s = make_scene(spec, rng);
  ThreadPool threads(1);
  const int64_t T = s.num_tokens();
  Buffer out(DType::i32, {T, 8});
  EXPECT_NO_THROW(indexer_topk_cpu(s.q, s.weights, *s.pool, kLayer, s.batch, 8, out, threads));
  // topk and out disagree, topk 0.
  EXPECT_THROW(indexer_topk_cpu(s.q, s.weights, *s.pool, kLayer, s.batch, 9, out, threads), Error);
  Buffer out0(DType::i32, {T, 0});
  EXPECT_THROW(indexer_topk_cpu(s.q, s.weights, *s.pool, kLayer, s.batch, 0, out0, threads), Error);
  // q head dim != the pool's index_head_dim; q in f16; q with one token fewer than the batch.
  Buffer q_dim(DType::f32, {T, spec.n_heads, spec.dim + 16});
  EXPECT_THROW(indexer_topk_cpu(q_dim, s.weights, *s.pool, kLayer, s.batch, 8, out, threads), Error);
  Buffer q_f16(DType::f16, {T, spec.n_heads, spec.dim});
  EXPECT_THROW(indexer_topk_cpu(q_f16, s.weights, *s.pool, kLayer, s.batch, 8, out, threads), Error);
  Buffer out_short(DType::i32, {T - 1, 8});
  EXPECT_THROW(indexer_topk_cpu(s.q.view().slice(0, T - 1), s.weights.view().slice(0, T - 1), *s.pool, kLayer,
                                s.batch, 8, out_short, threads),
               Error);
  // weights of the wrong shape or dtype; out of the wrong dtype.
  Buffer w_shape(DType::f32, {T, spec.n_heads + 1});
  EXPECT_THROW(indexer_topk_cpu(s.q, w_shape, *s.pool, kLayer, s.batch, 8, out, threads), Error);
  Buffer w_bf16(DType::bf16, {T, spec.n_heads});
  EXPECT_THROW(indexer_topk_cpu(s.q, w_bf16, *s.pool, kLayer, s.batch, 8, out, threads), Error);
  Buffer out_i64(DType::i64, {T, 8});
  EXPECT_THROW(indexer_topk_cpu(s.q, s.weights, *s.pool, kLayer, s.batch, 8, out_i64, threads), Error);
  // A layer the pool lacks; a batch without its ReqToTokenPool; a pool without indexer keys.
  EXPECT_THROW(indexer_topk_cpu(s.q, s.weights, *s.pool, 2, s.batch, 8, out, threads), Error);
  ForwardBatch no_table = s.batch;
  no_table.req_to_token_pool = nullptr;
  EXPECT_THROW(indexer_topk_cpu(s.q, s.weights, *s.pool, kLayer, no_table, 8, out, threads), Error);
  MLAKVPoolConfig plain = s.pool->config();
  plain.index_head_dim = 0;
  const MLAKVPool no_keys(plain);
  EXPECT_THROW(indexer_topk_cpu(s.q, s.weights, no_keys, kLayer, s.batch, 8, out, threads), Error);
}

}  // namespace
}  // namespace specula::testing::indexer
