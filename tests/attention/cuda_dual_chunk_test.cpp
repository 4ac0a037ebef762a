// Dual chunk attention on the CUDA backend: decode (one kernel, the variant switch per key tile),
// prefill / extend / mixed steps (passes of the prefill kernels merged by LSE) against the
// harness's float64 reference of the three parts; the sparse prefill pattern against the CPU
// backend's (itself tested against float64), and its selection kernels against a float64
// estimate and the CPU's top-k.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "attention/attention_harness.h"
#include "attention/cuda_check_support.h"
#include "cuda_test_support.h"
#include "specula/attention/cpu/cpu_backend.h"
#include "specula/attention/cpu/dual_chunk_sparse.h"
#include "specula/attention/cuda/cuda_attention_select.h"
#include "specula/attention/cuda/cuda_backend.h"
#include "specula/attention/cuda/dual_chunk_plan.h"
#include "specula/attention/cpu/dual_chunk.h"
#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/dual_chunk_sparse.h"
#include "specula/core/cuda_check.h"
#include "specula/core/dtype_codes.h"
#include "specula/core/error.h"

namespace specula::testing {
namespace {

namespace ck = cuda_kernels;

// Dual chunk decode: each key's chunk picks the query's rotary variant inside the split-KV
// kernel. Lengths inside the first chunk (intra only), the second (intra and successive) and
// later ones (all three parts), a chunk boundary just before the query; split plans of wide
// blocks (splits whose key ranges cross chunk boundaries), an unsplit plan and split 4-warp
// blocks (a batch that half fills the GPU), GQA groups of 4 and 7 heads, pages of 1 and 16, the
// long-context temperature, bf16 and fp8 caches.
TEST_F(CudaAttention, DualChunkDecode) {
  for (const DType kv : {DType::bf16, DType::fp8_e4m3}) {
    for (const int page : {1, 16}) {
      HarnessConfig c = decode_config(8, 2, page, kv);
      c.head_dim = 128;
      c.dca_chunk_len = 64;
      c.dca_original_max = page == 16 ? 100 : 0;
      c.requests = {{300, 1}, {100, 1}, {40, 1}, {127, 1}, {128, 1}, {191, 1}};
      check_cuda(c, kv == DType::fp8_e4m3 ? "dual chunk decode, fp8" : "dual chunk decode");
      c.num_q_heads = 28;
      c.num_kv_heads = 4;
      c.dca_chunk_len = 1024;
      c.requests = {{5000, 1}};  // one sequence: many splits, wide blocks
      check_cuda(c, "dual chunk decode, one long sequence");
    }
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    HarnessConfig c = decode_config(8, 2, 16, kv);
    c.head_dim = 128;
    c.dca_chunk_len = 48;
    c.requests = {{255, 1}, {100, 1}, {40, 1}, {95, 1}, {96, 1}, {143, 1}, {200, 1}};
    ASSERT_EQ(choose_decode_plan(7, 2, 256, sms).splits, 1);
    check_cuda(c, "dual chunk decode, unsplit 4-warp blocks");
    // Blocks for between half and all of the multiprocessors: split 4-warp blocks.
    const int seqs = (sms / 2 + 2) / 2 + 1;
    std::mt19937 rng = rng_for_shapes();
    c.requests.clear();
    for (int i = 0; i < seqs; ++i) c.requests.push_back({300 + static_cast<int>(rng() % 400), 1});
    const DecodePlan plan = choose_decode_plan(seqs, 2, 701, sms);
    ASSERT_GT(plan.splits, 1);
    ASSERT_EQ(plan.warps, 4);
    check_cuda(c, "dual chunk decode, split 4-warp blocks");
  }
}

// Dual chunk prefill, extend and mixed steps: each sequence's new tokens cut into runs at chunk
// boundaries, each run attending in up to three passes of the prefill kernels (warpgroup MMA for
// bf16 / f16 caches at head_dim 64 and 128, mma.sync for fp8 caches and head_dim 96) merged by
// LSE; runs inside the first chunk (one pass, writing the output itself); prefixes ending on a
// chunk boundary and mid-chunk, runs over several chunks, one-token rows; the temperature; GQA
// groups of 4 and 7; pages of 1 and 16; random lengths besides.
TEST_F(CudaAttention, DualChunkPrefill) {
  for (const DType kv : {DType::bf16, DType::fp8_e4m3}) {
    for (const int page : {1, 16}) {
      HarnessConfig c = decode_config(8, 2, page, kv);
      c.mode = ForwardMode::EXTEND;
      c.head_dim = 128;
      c.dca_chunk_len = 64;
      c.dca_original_max = page == 16 ? 100 : 0;
      c.requests = {{0, 300}, {37, 200}, {130, 1}, {64, 64}, {190, 2}, {0, 5}, {250, 140}};
      check_cuda(c, kv == DType::fp8_e4m3 ? "dual chunk prefill, fp8" : "dual chunk prefill");
      c.requests = {{0, 50}, {10, 20}, {3, 1}, {0, 64}};
      check_cuda(c, "dual chunk prefill inside the first chunk");
      c.mode = ForwardMode::MIXED;
      c.requests = {{100, 1}, {0, 140}, {255, 1}, {60, 10}};
      check_cuda(c, "dual chunk mixed step");
    }
  }
  std::mt19937 rng = rng_for_shapes();
  for (const int head_dim : {64, 96}) {
    for (const DType io : {DType::bf16, DType::f16}) {
      HarnessConfig c = decode_config(14, 2, 16, io);
      c.q_dtype = io;
      c.mode = ForwardMode::EXTEND;
      c.head_dim = head_dim;
      c.dca_chunk_len = 48;
      c.dca_original_max = 80;
      c.requests = random_requests(rng, 5, 300, 160, ForwardMode::EXTEND);
      c.requests.push_back({47, 2});
      check_cuda(c, io == DType::f16 ? "dual chunk prefill, GQA 7, f16" : "dual chunk prefill, GQA 7");
    }
  }
}

// The sparse prefill pattern through the CUDA backend against the CPU backend on the same inputs:
// lines kept only among the forced ones (the first columns and the nearest distances, which rank
// first whatever the scores), fewer than those, and every line (dense), so that both keep the
// same keys; sparse runs beside dense sequences (under the threshold, or one new token) in one
// step, runs over several chunks, pages of 1 and 16, the temperature; through the warpgroup-MMA
// kernel (bf16 cache, head_dim 128) and the mma.sync one with its tile skipping (fp8 cache,
// head_dim 96). The estimate and the ranking by score are tested on their own below.
TEST_F(CudaAttention, DualChunkSparsePrefill) {
  for (const auto& [kv, head_dim] :
       {std::pair{DType::bf16, 128}, std::pair{DType::fp8_e4m3, 128}, std::pair{DType::bf16, 96}}) {
    for (const auto& [vertical, slash] : {std::pair{6, 24}, std::pair{2, 5}, std::pair{100000, 100000}}) {
      for (const int page : {1, 16}) {
        auto pattern = std::make_shared<DualChunkSparsePattern>();
        pattern->threshold = 120;
        pattern->last_q = 8;
        pattern->forced_vertical = 6;
        pattern->forced_slash = 24;
        pattern->vertical.assign(8, vertical);
        pattern->slash.assign(8, slash);
        HarnessConfig c = decode_config(8, 2, page, kv);
        c.q_dtype = DType::bf16;
        c.mode = ForwardMode::EXTEND;
        c.head_dim = head_dim;
        c.dca_chunk_len = 64;
        c.dca_original_max = 100;
        c.dca_sparse = pattern;
        c.requests = {{0, 300}, {37, 200}, {130, 1}, {64, 64}, {0, 100}, {250, 140}};
        const uint64_t seed = fresh_seed();
        SCOPED_TRACE(::testing::Message() << dtype_name(kv) << " head_dim " << head_dim << " vertical " << vertical
                                          << " slash " << slash << " page " << page << " seed=" << seed);
        AttentionHarness h(c, seed);
        CpuAttentionBackend cpu(h.backend_options());
        const AttentionResult want = h.run(cpu);
        AttentionBackendOptions o = h.backend_options();
        o.device = Device::cuda(0);
        CudaAttentionBackend gpu(o);
        const AttentionResult got = h.run_on_device(gpu, Device::cuda(0));
        ASSERT_EQ(got.out.size(), want.out.size());
        double err = 0, lse_err = 0;
        for (size_t i = 0; i < want.out.size(); ++i) err = std::max(err, std::abs(got.out[i] - want.out[i]));
        for (size_t i = 0; i < want.lse.size(); ++i) lse_err = std::max(lse_err, std::abs(got.lse[i] - want.lse[i]));
        EXPECT_LT(err, 2e-2);
        EXPECT_LT(lse_err, 1e-2);
        // The pattern matters: dense attention of the same step (the harness's reference, which
        // leaves the pattern out) gives other outputs, except with every line kept.
        const AttentionResult dense_out = h.reference<double>();
        double moved = 0;
        for (size_t i = 0; i < want.out.size(); ++i) moved = std::max(moved, std::abs(dense_out.out[i] - want.out[i]));
        if (vertical < 1000) {
          EXPECT_GT(moved, 0.1);
        } else {
          EXPECT_LT(moved, 2e-2);  // the two bf16 roundings may differ by an ulp (0.0078 from 1 to 2)
        }
      }
    }
  }
}

// The selection kernels alone: the column and distance sums of two sparse runs (one in chunk 3
// estimating with variants 0, 3 and 4, one in chunk 1) against a float64 estimate from the same
// bf16 inputs, and the kept bitmaps against the CPU's top-k of the kernel's own sums (ties to the
// lower index, the forced lines first); keep counts of none, fewer than forced, more, and all.
TEST_F(CudaAttention, DualChunkSparseSelect) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (const float cap : {0.0f, 3.0f}) {
    const int Hq = 4, Hkv = 2, D = 64, cl = 48, V = 5;
    struct Run {
      int begin, end, key_slot0, token;
    };
    const std::vector<Run> runs = {{150, 192, 0, 0}, {50, 60, 192, 16}};  // chunk 3 and chunk 1
    const int last_q = 16, page_stride = 192, slots = 252, tokens = 26, max_end = 192;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<uint16_t> q(static_cast<size_t>(tokens) * Hq * V * D), k(static_cast<size_t>(slots) * Hkv * D);
    for (auto& x : q) x = to_bf16(dist(rng));
    for (auto& x : k) x = to_bf16(dist(rng));
    std::vector<int32_t> pages(2 * page_stride, 0), fields;
    std::vector<float> temperature = {1.25f, 1.0f};
    for (size_t r = 0; r < runs.size(); ++r) {
      for (int j = 0; j < runs[r].end; ++j) pages[r * page_stride + static_cast<size_t>(j)] = runs[r].key_slot0 + j;
      const int count = std::min(runs[r].end - runs[r].begin, last_q);
      const int32_t f[ck::kSparseRunFields] = {runs[r].token, runs[r].end - count, count, runs[r].end,
                                               runs[r].begin / cl, static_cast<int32_t>(r)};
      fields.insert(fields.end(), std::begin(f), std::end(f));
    }
    const std::vector<int32_t> lines = {0, 3, 10, 100000, /* slash: */ 5, 0, 40, 100000};
    int64_t partial = 0, lse = 0, scores = 0;
    ck::dual_chunk_sparse_workspace(2, Hq, max_end, partial, lse, scores);
    const size_t words = static_cast<size_t>(2 * Hq * ck::keep_words(max_end));
    DeviceArray<uint16_t> d_q(q), d_k(k);
    DeviceArray<int32_t> d_pages(pages), d_fields(fields), d_lines(lines);
    DeviceArray<float> d_temp(temperature), d_partial(static_cast<size_t>(partial)), d_lse(static_cast<size_t>(lse)),
        d_vertical(static_cast<size_t>(scores)), d_slash(static_cast<size_t>(scores));
    DeviceArray<uint32_t> d_cols(words), d_dists(words);
    ck::DualChunkSparseParams p{};
    p.q = d_q.get();
    p.q_stride_token = static_cast<int64_t>(Hq) * V * D;
    p.q_stride_head = static_cast<int64_t>(V) * D;
    p.q_dtype = ck::kBF16;
    p.k_cache = d_k.get();
    p.kv_dtype = ck::kBF16;
    p.k_descale = 1.0f;
    p.num_q_heads = Hq;
    p.num_kv_heads = Hkv;
    p.head_dim = D;
    p.page_size = 1;
    p.chunk_len = cl;
    p.scale = 0.4f;
    p.logit_cap = cap;
    p.num_runs = 2;
    p.runs = d_fields.get();
    p.temperature = d_temp.get();
    p.pages = d_pages.get();
    p.page_stride = page_stride;
    p.keep_vertical = d_lines.get();
    p.keep_slash = d_lines.get() + Hq;
    p.forced_vertical = 4;
    p.forced_slash = 8;
    p.max_end = max_end;
    p.partial = d_partial.get();
    p.lse = d_lse.get();
    p.vertical = d_vertical.get();
    p.slash = d_slash.get();
    p.keep_cols = d_cols.get();
    p.keep_dists = d_dists.get();
    ck::launch_dual_chunk_sparse_select(p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> vert = d_vertical.download(), sl = d_slash.download();
    const std::vector<uint32_t> cols = d_cols.download(), dists = d_dists.download();
    for (size_t r = 0; r < runs.size(); ++r) {
      const int end = runs[r].end, chunk = runs[r].begin / cl, count = std::min(end - runs[r].begin, last_q);
      for (int h = 0; h < Hq; ++h) {
        const int kh = h / (Hq / Hkv);
        std::vector<double> want_v(static_cast<size_t>(end), 0.0), want_s(static_cast<size_t>(end), 0.0);
        for (int e = 0; e < count; ++e) {
          const int pos = end - count + e;
          std::vector<double> s(static_cast<size_t>(pos + 1));
          for (int j = 0; j <= pos; ++j) {
            const int kc = j / cl, variant = kc == chunk ? 0 : kc == chunk - 1 ? 3 : 4;
            double dot = 0;
            for (int d = 0; d < D; ++d) {
              dot += static_cast<double>(from_bf16(q[((static_cast<size_t>(runs[r].token + e) * Hq + h) * V + variant) * D + d])) *
                     from_bf16(k[((static_cast<size_t>(runs[r].key_slot0 + j)) * Hkv + kh) * D + d]);
            }
            double v = dot * 0.4 * temperature[r];
            if (cap > 0) v = cap * std::tanh(v / cap);
            s[static_cast<size_t>(j)] = v;
          }
          const double top = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double& v : s) sum += v = std::exp(v - top);
          for (int j = 0; j <= pos; ++j) {
            want_v[static_cast<size_t>(j)] += s[static_cast<size_t>(j)] / sum;
            want_s[static_cast<size_t>(pos - j)] += s[static_cast<size_t>(j)] / sum;
          }
        }
        const size_t row = (r * Hq + static_cast<size_t>(h)) * max_end;
        std::vector<double> got_v(static_cast<size_t>(end)), got_s(static_cast<size_t>(end));
        for (int j = 0; j < end; ++j) {
          got_v[static_cast<size_t>(j)] = vert[row + static_cast<size_t>(j)];
          got_s[static_cast<size_t>(j)] = sl[row + static_cast<size_t>(j)];
          ASSERT_NEAR(got_v[static_cast<size_t>(j)], want_v[static_cast<size_t>(j)], 1e-4 * count) << "run " << r << " head " << h << " column " << j;
          ASSERT_NEAR(got_s[static_cast<size_t>(j)], want_s[static_cast<size_t>(j)], 1e-4 * count) << "run " << r << " head " << h << " distance " << j;
        }
        std::fill_n(got_v.begin(), std::min(4, end), INFINITY);
        std::fill_n(got_s.begin(), std::min(8, end), INFINITY);
        const std::vector<bool> keep_v = top_scores(got_v, lines[static_cast<size_t>(h)]);
        const std::vector<bool> keep_s = top_scores(got_s, lines[static_cast<size_t>(Hq + h)]);
        const size_t word0 = (r * Hq + static_cast<size_t>(h)) * static_cast<size_t>(ck::keep_words(max_end));
        for (int j = 0; j < max_end; ++j) {
          const bool col = (cols[word0 + static_cast<size_t>(j / 32)] >> (j % 32)) & 1u;
          const bool dst = (dists[word0 + static_cast<size_t>(j / 32)] >> (j % 32)) & 1u;
          ASSERT_EQ(col, j < end && keep_v[static_cast<size_t>(j)]) << "run " << r << " head " << h << " column " << j;
          ASSERT_EQ(dst, j < end && keep_s[static_cast<size_t>(j)]) << "run " << r << " head " << h << " distance " << j;
        }
      }
    }
  }
}

// The step plan alone (host code; runs without a GPU): every query row lies in exactly one run, at
// its position, inside one chunk; each pass's keys, first key and page slice follow from that
// chunk; temperatures, work items and the sparse runs' fields from their definitions.
TEST(CudaDualChunkPlan, RunsPassesAndSparseRuns) {
  const int cl = 64, page = 16, orig = 100;
  const std::vector<int32_t> q_lens = {300, 200, 1, 64, 5}, kv_lens = {300, 237, 131, 128, 70};
  PageTable table;
  table.max_pages = 19;
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed()));
  for (size_t i = 0; i < q_lens.size() * static_cast<size_t>(table.max_pages); ++i) table.pages.push_back(static_cast<int32_t>(rng() % 5000));
  DualChunkSparsePattern sparse;
  sparse.threshold = 120;
  sparse.last_q = 8;
  const CudaDualChunkPlan d = plan_cuda_dual_chunk(cl, orig, page, q_lens, kv_lens, table, &sparse);
  ASSERT_EQ(d.num_parts, 3);
  ASSERT_EQ(d.cu_q.front(), 0);
  int row = 0, sparse_seen = 0;
  size_t v = 0, item = 0;
  for (size_t seq = 0; seq < q_lens.size(); ++seq) {
    for (int pos = kv_lens[seq] - q_lens[seq]; pos < kv_lens[seq]; ++pos, ++row) {
      while (v + 1 < d.cu_q.size() && d.cu_q[v + 1] <= row) ++v;
      ASSERT_LT(v, static_cast<size_t>(d.num_runs));
      ASSERT_EQ(d.q_base[v] + (row - d.cu_q[v]), pos) << "row " << row;
      const int c = pos / cl, first = d.q_base[v], last = d.q_base[v] + (d.cu_q[v + 1] - d.cu_q[v]) - 1;
      ASSERT_EQ(first / cl, c);
      ASSERT_EQ(last / cl, c);
      if (row != d.cu_q[v]) continue;  // the run's own checks, once
      ASSERT_TRUE(last + 1 == kv_lens[seq] || (last + 1) % cl == 0) << "runs end at the sequence's end or a chunk's";
      const int key_begin[3] = {c * cl, std::max(c - 1, 0) * cl, 0};
      const int keys[3] = {last + 1 - c * cl, c >= 1 ? cl : 0, c >= 2 ? (c - 1) * cl : 0};
      for (int part = 0; part < 3; ++part) {
        ASSERT_EQ(d.kv_lens[static_cast<size_t>(part)][v], keys[part]) << "run " << v << " part " << part;
        if (keys[part] > 0) {
          ASSERT_EQ(d.key_base[static_cast<size_t>(part)][v], key_begin[part]);
        }
        for (int i = 0; i * page < keys[part]; ++i) {
          ASSERT_EQ(d.pages[static_cast<size_t>(part)][v * static_cast<size_t>(d.page_stride) + static_cast<size_t>(i)],
                    table.row(static_cast<int>(seq))[key_begin[part] / page + i]);
        }
      }
      EXPECT_FLOAT_EQ(d.temperature[v], static_cast<float>(dual_chunk_logit_scale(kv_lens[seq], orig)));
      for (int q = 0; q < last - first + 1; q += ck::kPrefillTileRows, ++item) {
        ASSERT_EQ(d.items[2 * item], static_cast<int32_t>(v));
        ASSERT_EQ(d.items[2 * item + 1], q);
      }
      const bool is_sparse = q_lens[seq] >= 2 && kv_lens[seq] > sparse.threshold;
      ASSERT_EQ(d.keep_run[v], is_sparse ? sparse_seen : -1) << "run " << v;
      if (!is_sparse) continue;
      const int32_t* f = d.sparse_runs.data() + static_cast<size_t>(sparse_seen) * ck::kSparseRunFields;
      const int count = std::min(last + 1 - first, sparse.last_q);
      EXPECT_EQ(f[ck::kRunToken], d.cu_q[v] + (last + 1 - count - first));
      EXPECT_EQ(f[ck::kRunFirstPos], last + 1 - count);
      EXPECT_EQ(f[ck::kRunCount], count);
      EXPECT_EQ(f[ck::kRunEnd], last + 1);
      EXPECT_EQ(f[ck::kRunChunk], c);
      EXPECT_EQ(f[ck::kRunPageRow], static_cast<int32_t>(seq));
      ++sparse_seen;
    }
  }
  EXPECT_EQ(row, d.cu_q.back());
  EXPECT_EQ(item, d.items.size() / 2);
  EXPECT_EQ(sparse_seen, d.num_sparse);
  EXPECT_EQ(d.sparse_max_end, 300);
  // A chunk that is not a whole number of pages, and more estimating queries than the kernels hold.
  EXPECT_THROW(plan_cuda_dual_chunk(40, orig, page, q_lens, kv_lens, table, nullptr), Error);
  sparse.last_q = ck::kMaxSparseEstimators + 1;
  EXPECT_THROW(plan_cuda_dual_chunk(cl, orig, page, q_lens, kv_lens, table, &sparse), Error);
}

}  // namespace
}  // namespace specula::testing
