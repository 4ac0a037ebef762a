// DraftCascadeBackend (the draft head's tree-expansion attention) against two references on fresh
// random pools: a float64 softmax over the union of each row's prefix and branch keys read straight
// from the pool, and the plain page-size-1 CPU backend over one request row per branch listing the
// prefix slots then the branch slots. Branch slots come from shuffled free pages, so they are
// neither page-contiguous nor in the request's row. Plus the inputs the backend must refuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/kv/token_allocator.h"
#include "specula/speculative/draft_backend.h"

namespace specula {
namespace {

constexpr int kNumQHeads = 4;
constexpr int kNumKvHeads = 2;
constexpr int kHeadDim = 64;
constexpr int kLayerId = 1;  // not 0: catches code that ignores the layer index
constexpr int kMaxPrefix = 70;
constexpr int kMaxBranchLen = 6;
constexpr int kAncestorsPerRequest = kMaxBranchLen - 1;
constexpr int kKvWidth = kNumKvHeads * kHeadDim;
constexpr int kQWidth = kNumQHeads * kHeadDim;

// One draft step over a random pool: requests with random prefixes and topk branches each.
struct DraftStep {
  int page_size = 1;
  int topk = 1;
  int num_requests = 0;
  int rows = 0;
  AttentionLayer layer;
  std::unique_ptr<PagedTokenAllocator> allocator;
  std::unique_ptr<ReqToTokenPool> req_pool;
  std::unique_ptr<MHAKVPool> kv_pool;
  std::vector<int32_t> req_rows;                  // [num_requests] request-table row
  std::vector<std::vector<int32_t>> prefix_slots;  // [num_requests][prefix_len]
  std::vector<int32_t> row_request;               // [rows] the request of each row
  std::shared_ptr<DraftStepInfo> info;
  std::vector<int32_t> branch_offsets;  // [rows] start of each row's branch in info->branch_slots
  std::vector<float> q, k, v;           // [rows, heads, head_dim]
  ForwardBatch batch;
};

std::vector<float> random_normal(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng);
  return x;
}

DraftStep make_step(int page_size, int topk, std::mt19937& rng) {
  DraftStep s;
  s.page_size = page_size;
  s.topk = topk;
  s.num_requests = 2 + static_cast<int>(rng() % 3);
  s.rows = s.num_requests * topk;
  s.layer.layer_id = kLayerId;
  s.layer.num_q_heads = kNumQHeads;
  s.layer.num_kv_heads = kNumKvHeads;
  s.layer.head_dim = kHeadDim;

  std::vector<int32_t> prefix_lens(static_cast<size_t>(s.num_requests));
  int64_t pages = 0;
  for (int32_t& len : prefix_lens) {
    len = 1 + static_cast<int32_t>(rng() % kMaxPrefix);
    pages += (len + page_size - 1) / page_size;
  }
  const int branch_slot_count = s.num_requests * (kAncestorsPerRequest + topk);
  // Twice the pages the branches need (so the chosen slots are scattered) plus spares.
  const int64_t branch_pages = 2 * ((branch_slot_count + page_size - 1) / page_size) + 2;
  s.allocator = std::make_unique<PagedTokenAllocator>((pages + branch_pages + 4) * page_size, page_size);
  s.kv_pool = std::make_unique<MHAKVPool>(
      KVPoolConfig{s.allocator->total_slots(), 2, kNumKvHeads, kHeadDim, 0, DType::f32, Device::cpu()});
  // The whole pool, both layers, random: any slot read by mistake contributes garbage.
  for (int l = 0; l < 2; ++l) {
    for (const TensorView& buf : {s.kv_pool->k_buffer(l), s.kv_pool->v_buffer(l)}) {
      const auto values = random_normal(static_cast<size_t>(buf.numel()), rng);
      std::copy(values.begin(), values.end(), buf.data_as<float>());
    }
  }

  // Request rows are a shuffled subset of the table, so they differ from the batch indices.
  s.req_pool = std::make_unique<ReqToTokenPool>(s.num_requests + 3, kMaxPrefix + kMaxBranchLen);
  std::vector<int32_t> table_rows = s.req_pool->alloc(s.num_requests + 3).value();
  std::shuffle(table_rows.begin(), table_rows.end(), rng);
  // A page of filler first, so that prefixes do not all start at the first page.
  const auto filler = s.allocator->alloc(page_size).value();
  for (int r = 0; r < s.num_requests; ++r) {
    const int32_t prefix[] = {0}, seq[] = {prefix_lens[static_cast<size_t>(r)]}, last[] = {-1};
    const auto slots = s.allocator->alloc_extend(prefix, seq, last).value();
    s.req_rows.push_back(table_rows[static_cast<size_t>(r)]);
    s.req_pool->write(s.req_rows.back(), 0, slots);
    s.prefix_slots.push_back(slots);
  }
  s.allocator->free(filler);

  // Branch slots: free pages of the allocator, every slot of them shuffled together.
  auto free_slots = s.allocator->alloc((branch_pages - 2) * page_size).value();
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  size_t next_free = 0;

  s.info = std::make_shared<DraftStepInfo>();
  DraftStepInfo& info = *s.info;
  for (int r = 0; r < s.num_requests; ++r) {
    // Earlier draft steps' nodes of this request: what the branches' ancestors are chosen from.
    std::vector<int32_t> ancestors(free_slots.begin() + static_cast<int64_t>(next_free),
                                   free_slots.begin() + static_cast<int64_t>(next_free) + kAncestorsPerRequest);
    next_free += kAncestorsPerRequest;
    for (int b = 0; b < topk; ++b) {
      const int32_t len = 1 + static_cast<int32_t>(rng() % kMaxBranchLen);
      std::shuffle(ancestors.begin(), ancestors.end(), rng);
      s.branch_offsets.push_back(static_cast<int32_t>(info.branch_slots.size()));
      info.branch_slots.insert(info.branch_slots.end(), ancestors.begin(), ancestors.begin() + (len - 1));
      const int32_t own = free_slots[next_free++];
      info.branch_slots.push_back(own);
      info.prefix_req_pool_indices.push_back(s.req_rows[static_cast<size_t>(r)]);
      info.prefix_lens.push_back(prefix_lens[static_cast<size_t>(r)]);
      info.branch_lens.push_back(len);
      s.row_request.push_back(r);

      s.batch.req_pool_indices.push_back(s.req_rows[static_cast<size_t>(r)]);
      s.batch.seq_lens.push_back(prefix_lens[static_cast<size_t>(r)] + len);
      s.batch.positions.push_back(prefix_lens[static_cast<size_t>(r)] + len - 1);
      s.batch.input_ids.push_back(static_cast<int32_t>(rng() % 256));
      s.batch.out_cache_loc.push_back(own);
    }
  }
  s.batch.forward_mode = ForwardMode::DECODE;
  s.batch.batch_size = s.rows;
  s.batch.req_to_token_pool = s.req_pool.get();
  s.batch.token_to_kv_pool = s.kv_pool.get();
  s.batch.spec_info = s.info;

  s.q = random_normal(static_cast<size_t>(s.rows) * kQWidth, rng);
  s.k = random_normal(static_cast<size_t>(s.rows) * kKvWidth, rng);
  s.v = random_normal(static_cast<size_t>(s.rows) * kKvWidth, rng);
  return s;
}

struct Result {
  std::vector<float> out;  // [rows, num_q_heads, head_dim]
  std::vector<float> lse;  // [rows, num_q_heads]
};

// Runs one backend on the step's q/k/v, outputs poisoned with NaN first.
Result run(AttentionBackend& backend, DraftStep& s, const ForwardBatch& batch, bool save_kv) {
  Buffer q(DType::f32, {s.rows, kNumQHeads, kHeadDim});
  Buffer k(DType::f32, {s.rows, kNumKvHeads, kHeadDim});
  Buffer v(DType::f32, {s.rows, kNumKvHeads, kHeadDim});
  Buffer out(DType::f32, {s.rows, kNumQHeads, kHeadDim});
  Buffer lse(DType::f32, {s.rows, kNumQHeads});
  std::copy(s.q.begin(), s.q.end(), q.data_as<float>());
  std::copy(s.k.begin(), s.k.end(), k.data_as<float>());
  std::copy(s.v.begin(), s.v.end(), v.data_as<float>());
  std::fill_n(out.data_as<float>(), out.numel(), NAN);
  std::fill_n(lse.data_as<float>(), lse.numel(), NAN);
  backend.check_layer(s.layer, DType::f32, DType::f32);
  backend.init_forward_metadata(batch);
  ForwardOptions options;
  options.save_kv_cache = save_kv;
  options.lse = lse;
  backend.forward(q, k, v, out, s.layer, batch, options);
  return {std::vector<float>(out.data_as<float>(), out.data_as<float>() + out.numel()),
          std::vector<float>(lse.data_as<float>(), lse.data_as<float>() + lse.numel())};
}

struct Reference {
  std::vector<double> out;
  std::vector<double> lse;
};

// float64 softmax(scale q.k) v per row over the prefix keys then the branch keys, with K/V read
// from a snapshot of the pool taken before the step (the row's own slot from the new k/v).
Reference naive_reference(const DraftStep& s, const std::vector<float>& k_pool, const std::vector<float>& v_pool) {
  Reference ref;
  ref.out.assign(static_cast<size_t>(s.rows) * kQWidth, 0.0);
  ref.lse.assign(static_cast<size_t>(s.rows) * kNumQHeads, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  const int group = kNumQHeads / kNumKvHeads;
  for (int row = 0; row < s.rows; ++row) {
    const auto ur = static_cast<size_t>(row);
    const auto& prefix = s.prefix_slots[static_cast<size_t>(s.row_request[ur])];
    const int32_t branch_len = s.info->branch_lens[ur];
    // Key sources: a pointer into the snapshot (or into the new k/v for the row's own slot).
    std::vector<const float*> keys, values;
    for (int32_t slot : prefix) {
      keys.push_back(k_pool.data() + static_cast<size_t>(slot) * kKvWidth);
      values.push_back(v_pool.data() + static_cast<size_t>(slot) * kKvWidth);
    }
    for (int32_t j = 0; j < branch_len - 1; ++j) {
      const int32_t slot = s.info->branch_slots[static_cast<size_t>(s.branch_offsets[ur] + j)];
      keys.push_back(k_pool.data() + static_cast<size_t>(slot) * kKvWidth);
      values.push_back(v_pool.data() + static_cast<size_t>(slot) * kKvWidth);
    }
    keys.push_back(s.k.data() + ur * kKvWidth);
    values.push_back(s.v.data() + ur * kKvWidth);

    for (int h = 0; h < kNumQHeads; ++h) {
      const int kvh = h / group;
      const float* q = s.q.data() + ur * kQWidth + static_cast<size_t>(h) * kHeadDim;
      std::vector<double> scores(keys.size());
      double max_score = -INFINITY;
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0;
        for (int d = 0; d < kHeadDim; ++d) dot += static_cast<double>(q[d]) * keys[j][kvh * kHeadDim + d];
        scores[j] = dot * scale;
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0;
      for (double& x : scores) {
        x = std::exp(x - max_score);
        sum += x;
      }
      double* o = ref.out.data() + ur * kQWidth + static_cast<size_t>(h) * kHeadDim;
      for (size_t j = 0; j < keys.size(); ++j) {
        for (int d = 0; d < kHeadDim; ++d) o[d] += scores[j] / sum * values[j][kvh * kHeadDim + d];
      }
      ref.lse[ur * kNumQHeads + static_cast<size_t>(h)] = max_score + std::log(sum);
    }
  }
  return ref;
}

// The per-branch reference: the plain page-size-1 CPU backend over a table whose row i lists row
// i's prefix slots then its branch slots (the new K/V are already in the pool).
Result per_branch_reference(DraftStep& s) {
  ReqToTokenPool table(s.rows, kMaxPrefix + kMaxBranchLen);
  ForwardBatch b;
  b.forward_mode = ForwardMode::DECODE;
  b.batch_size = s.rows;
  b.req_pool_indices = table.alloc(s.rows).value();
  for (int row = 0; row < s.rows; ++row) {
    const auto ur = static_cast<size_t>(row);
    std::vector<int32_t> slots = s.prefix_slots[static_cast<size_t>(s.row_request[ur])];
    const auto begin = s.info->branch_slots.begin() + s.branch_offsets[ur];
    slots.insert(slots.end(), begin, begin + s.info->branch_lens[ur]);
    table.write(b.req_pool_indices[ur], 0, slots);
    b.seq_lens.push_back(static_cast<int32_t>(slots.size()));
  }
  b.positions = s.batch.positions;
  b.input_ids = s.batch.input_ids;
  b.out_cache_loc = s.batch.out_cache_loc;
  b.req_to_token_pool = &table;
  b.token_to_kv_pool = s.kv_pool.get();
  AttentionBackendOptions options;
  options.page_size = 1;
  auto backend = make_attention_backend("cpu", options);
  return run(*backend, s, b, /*save_kv=*/false);
}

std::vector<float> snapshot(const TensorView& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

TEST(DraftCascade, MatchesTheNaiveAndThePerBranchReferences) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int page_size : {1, 16}) {
    for (int topk : {1, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "page_size " << page_size << " topk " << topk);
      DraftStep s = make_step(page_size, topk, rng);
      std::vector<std::vector<float>> before;
      for (int l = 0; l < 2; ++l) {
        before.push_back(snapshot(s.kv_pool->k_buffer(l)));
        before.push_back(snapshot(s.kv_pool->v_buffer(l)));
      }
      const Reference truth = naive_reference(s, before[2 * kLayerId], before[2 * kLayerId + 1]);

      AttentionBackendOptions options;
      options.page_size = page_size;
      // One spare row: the backend must not depend on the batch filling all of them.
      DraftCascadeBackend backend("cpu", options, s.rows + 1, kMaxBranchLen);
      EXPECT_EQ(backend.name(), "draft_cascade");
      const Result got = run(backend, s, s.batch, /*save_kv=*/true);

      // The pool: each row's own slot of this layer now holds its new k/v, nothing else changed.
      std::vector<std::vector<float>> expected_pool = before;
      for (int row = 0; row < s.rows; ++row) {
        const auto slot = static_cast<size_t>(s.batch.out_cache_loc[static_cast<size_t>(row)]);
        std::copy_n(s.k.begin() + row * kKvWidth, kKvWidth, expected_pool[2 * kLayerId].begin() + slot * kKvWidth);
        std::copy_n(s.v.begin() + row * kKvWidth, kKvWidth, expected_pool[2 * kLayerId + 1].begin() + slot * kKvWidth);
      }
      for (int l = 0; l < 2; ++l) {
        EXPECT_TRUE(snapshot(s.kv_pool->k_buffer(l)) == expected_pool[static_cast<size_t>(2 * l)])
            << "K of layer " << l;
        EXPECT_TRUE(snapshot(s.kv_pool->v_buffer(l)) == expected_pool[static_cast<size_t>(2 * l + 1)])
            << "V of layer " << l;
      }

      double out_err = 0, lse_err = 0;
      size_t worst = 0;
      for (size_t i = 0; i < truth.out.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got.out[i])) << "output " << i << " is " << got.out[i];
        const double e = std::fabs(got.out[i] - truth.out[i]);
        if (e > out_err) {
          out_err = e;
          worst = i;
        }
      }
      for (size_t i = 0; i < truth.lse.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got.lse[i])) << "LSE " << i << " is " << got.lse[i];
        lse_err = std::max(lse_err, std::fabs(got.lse[i] - truth.lse[i]));
      }
      EXPECT_LE(out_err, 1e-4) << "worst output " << worst << " (row " << worst / kQWidth << "): got "
                               << got.out[worst] << ", want " << truth.out[worst];
      EXPECT_LE(lse_err, 1e-4);

      const Result plain = per_branch_reference(s);
      double plain_out_err = 0, plain_lse_err = 0;
      for (size_t i = 0; i < got.out.size(); ++i) {
        plain_out_err = std::max(plain_out_err, static_cast<double>(std::fabs(got.out[i] - plain.out[i])));
      }
      for (size_t i = 0; i < got.lse.size(); ++i) {
        plain_lse_err = std::max(plain_lse_err, static_cast<double>(std::fabs(got.lse[i] - plain.lse[i])));
      }
      EXPECT_LE(plain_out_err, 1e-5) << "against the page-size-1 CPU backend";
      EXPECT_LE(plain_lse_err, 1e-5) << "against the page-size-1 CPU backend";
    }
  }
}

TEST(DraftCascadeErrors, BadStepsAreRefused) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int page_size : {1, 16}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page_size);
    DraftStep s = make_step(page_size, 4, rng);
    AttentionBackendOptions options;
    options.page_size = page_size;
    DraftCascadeBackend backend("cpu", options, s.rows, kMaxBranchLen);
    // The untouched step is accepted (so the refusals below are about what each one changes).
    EXPECT_NO_THROW(backend.init_forward_metadata(s.batch));

    {  // A branch that does not end with the row's own slot: the last slot is another row's.
      ForwardBatch b = s.batch;
      auto info = std::make_shared<DraftStepInfo>(*s.info);
      const int row = static_cast<int>(rng() % static_cast<unsigned>(s.rows));
      const int other = (row + 1) % s.rows;
      const auto last = static_cast<size_t>(s.branch_offsets[static_cast<size_t>(row)] +
                                             info->branch_lens[static_cast<size_t>(row)] - 1);
      info->branch_slots[last] = b.out_cache_loc[static_cast<size_t>(other)];
      b.spec_info = info;
      EXPECT_THROW(backend.init_forward_metadata(b), Error) << "row " << row;
    }
    {  // The row's own slot first, an ancestor last.
      ForwardBatch b = s.batch;
      auto info = std::make_shared<DraftStepInfo>(*s.info);
      int row = -1;
      for (int r = 0; r < s.rows; ++r) {
        if (info->branch_lens[static_cast<size_t>(r)] > 1) row = r;
      }
      if (row < 0) {  // every branch had length 1: lengthen row 0 by an ancestor, placed last
        row = 0;
        info->branch_lens[0] = 2;
        info->branch_slots.insert(info->branch_slots.begin() + 1, s.prefix_slots[0][0]);
      } else {
        const auto begin = info->branch_slots.begin() + s.branch_offsets[static_cast<size_t>(row)];
        std::reverse(begin, begin + info->branch_lens[static_cast<size_t>(row)]);
      }
      b.spec_info = info;
      EXPECT_THROW(backend.init_forward_metadata(b), Error) << "row " << row;
    }
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::TARGET_VERIFY, ForwardMode::DRAFT_EXTEND,
                             ForwardMode::MIXED}) {
      ForwardBatch b = s.batch;
      b.forward_mode = mode;
      b.extend_prefix_lens.assign(static_cast<size_t>(s.rows), 0);
      b.extend_seq_lens = b.seq_lens;
      s.info->num_draft_tokens = 1;
      EXPECT_THROW(backend.init_forward_metadata(b), Error) << forward_mode_name(mode);
    }
    {  // No spec_info, and a plain SpecInfo that is not a DraftStepInfo.
      ForwardBatch b = s.batch;
      b.spec_info = nullptr;
      EXPECT_THROW(backend.init_forward_metadata(b), Error);
      b.spec_info = std::make_shared<SpecInfo>();
      EXPECT_THROW(backend.init_forward_metadata(b), Error);
    }
    {  // Branch lengths that do not add up to the branch slots.
      ForwardBatch b = s.batch;
      auto info = std::make_shared<DraftStepInfo>(*s.info);
      info->branch_slots.insert(info->branch_slots.begin(), info->branch_slots.back());
      b.spec_info = info;
      EXPECT_THROW(backend.init_forward_metadata(b), Error);
    }
    {  // Per-row vectors of the wrong length.
      ForwardBatch b = s.batch;
      auto info = std::make_shared<DraftStepInfo>(*s.info);
      info->prefix_lens.pop_back();
      b.spec_info = info;
      EXPECT_THROW(backend.init_forward_metadata(b), Error);
    }
    {  // More rows than the backend was built for.
      DraftCascadeBackend small("cpu", options, s.rows - 1, kMaxBranchLen);
      EXPECT_THROW(small.init_forward_metadata(s.batch), Error);
    }
  }
}

}  // namespace
}  // namespace specula
