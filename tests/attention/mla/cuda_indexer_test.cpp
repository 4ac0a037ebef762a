// The GPU side of sparse MLA's index selection: the device index conversion against the host one
// (exactly), and the device lightning indexer (attention/mla/cuda/kernels/indexer.h) against the
// CPU oracle and the float64 reference of indexer_scene.h at DeepSeek-V3.2's shapes (64 heads of
// 128 dims, kv lengths up to 65536, topk 2048 and 64, page sizes 1 and 64 plus a page size that
// forces the per-key load path), exact ties (identical keys), and a CUDA-graph capture replayed
// with new positions. Random inputs; the seed is printed and can be fixed with
// SPECULA_TEST_SEED. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "indexer_scene.h"
#include "specula/attention/mla/cpu/indexer.h"
#include "specula/attention/mla/cuda/kernels/indexer.h"
#include "specula/attention/mla/cuda/kernels/sparse_indices.h"
#include "specula/attention/mla/sparse_indices.h"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_graph.h"
#include "specula/core/device.h"
#include "specula/core/error.h"
#include "specula/core/thread_pool.h"

namespace specula::testing::indexer {
namespace {

namespace ck = cuda_kernels;

uint64_t seed() { return test_seed("cuda_mla_test"); }

int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// ---- index conversion -----------------------------------------------------------------------------

TEST(CudaSparseIndices, DeviceEqualsHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(seed() ^ 0x5151);
  for (int page_size : {1, 64}) {
    for (int trial = 0; trial < 6; ++trial) {
      SCOPED_TRACE("page_size " + std::to_string(page_size) + " trial " + std::to_string(trial));
      const int batch = uniform(rng, 1, 8);
      // 2048 and 2052: four entries a thread, one and three blocks a token (the last partly
      // filled); the random ones mostly take the scalar path.
      const int topk = trial == 0 ? 2048 : trial == 1 ? 2052 : uniform(rng, 1, 2600);
      std::vector<int32_t> kv_lens(static_cast<size_t>(batch));
      int longest = 1;
      for (auto& l : kv_lens) longest = std::max(longest, l = uniform(rng, 0, 9000));
      int max_pages = (longest + page_size - 1) / page_size;
      if (trial % 3 == 2) max_pages = std::max(0, max_pages - 1);  // the longest request's tail is past the width
      std::vector<int32_t> page_table(static_cast<size_t>(batch) * static_cast<size_t>(max_pages));
      for (auto& pg : page_table) pg = uniform(rng, 0, 20000);
      const int num_tokens = uniform(rng, 1, 40);
      std::vector<int32_t> req_id(static_cast<size_t>(num_tokens));
      for (auto& r : req_id) r = uniform(rng, 0, batch - 1);
      std::vector<int32_t> indices(static_cast<size_t>(num_tokens) * static_cast<size_t>(topk));
      for (auto& idx : indices) {
        const int kind = uniform(rng, 0, 9);
        idx = kind == 0 ? -1 : kind == 1 ? uniform(rng, -100000, -2) : kind == 2 ? uniform(rng, 9000, 100000)
                                                                                 : uniform(rng, 0, 9100);
      }
      std::vector<int32_t> host(indices.size());
      convert_req_index_to_global_index({req_id, page_table, kv_lens, max_pages, page_size}, indices, topk, host);

      DeviceArray<int32_t> d_req(req_id), d_pages(page_table.empty() ? std::vector<int32_t>{0} : page_table),
          d_lens(kv_lens), d_indices(indices), d_out(indices.size());
      d_out.fill_bytes(0x5a);
      ck::SparseIndexParams p{};
      p.req_id_per_token = d_req.get();
      p.page_table = d_pages.get();
      p.kv_lens = d_lens.get();
      p.token_indices = d_indices.get();
      p.out = d_out.get();
      p.num_tokens = num_tokens;
      p.topk = topk;
      p.batch_size = batch;
      p.max_pages = max_pages;
      p.page_size = page_size;
      ck::launch_convert_req_index_to_global_index(p, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(d_out.download(), host);
    }
  }
}

TEST(CudaSparseIndices, RequestOutsideTheBatchGivesMinusOne) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // Token 0 is valid; tokens 1 and -1 name requests outside a batch of one.
  DeviceArray<int32_t> req(std::vector<int32_t>{0, 1, -1}), pages(std::vector<int32_t>{3}),
      lens(std::vector<int32_t>{4}), indices(std::vector<int32_t>{2, 2, 2}), out(3);
  ck::SparseIndexParams p{};
  p.req_id_per_token = req.get();
  p.page_table = pages.get();
  p.kv_lens = lens.get();
  p.token_indices = indices.get();
  p.out = out.get();
  p.num_tokens = 3;
  p.topk = 1;
  p.batch_size = 1;
  p.max_pages = 1;
  p.page_size = 4;
  ck::launch_convert_req_index_to_global_index(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.download(), (std::vector<int32_t>{14, -1, -1}));
}

// ---- lightning indexer ----------------------------------------------------------------------------

// A scene's inputs on the device (q must be bf16) and the params of one launch.
struct DeviceIndexer {
  DeviceIndexer(const Scene& s, int topk)
      : q(bf16_bits(s)),
        weights(std::vector<float>(s.weights.data_as<float>(), s.weights.data_as<float>() + s.weights.numel())),
        cache(cache_bytes(s)),
        page_table(s.page_table),
        token_req(s.token_req),
        token_pos(s.token_pos),
        out(static_cast<size_t>(s.num_tokens()) * static_cast<size_t>(topk)) {
    p.q = q.get();
    p.weights = weights.get();
    p.index_cache = cache.get();
    p.page_table = page_table.get();
    p.token_req = token_req.get();
    p.token_pos = token_pos.get();
    p.out = out.get();
    p.num_tokens = static_cast<int32_t>(s.num_tokens());
    p.n_heads = s.spec.n_heads;
    p.index_head_dim = s.spec.dim;
    p.max_pages = s.max_pages;
    p.page_size = s.spec.page_size;
    p.max_kv_len = s.max_kv_len;
    p.topk = topk;
    const ck::IndexerConfig config = ck::select_indexer(p);
    SPECULA_REQUIRE(config.unsupported.empty(), config.unsupported);
    scores = std::make_unique<DeviceArray<float>>(std::max<size_t>(config.workspace_bytes / sizeof(float), 1));
    p.scores = scores->get();
  }

  static std::vector<uint16_t> bf16_bits(const Scene& s) {
    SPECULA_REQUIRE(s.q.dtype() == DType::bf16, "the device indexer takes bf16 queries");
    const auto* bits = s.q.data_as<uint16_t>();
    return {bits, bits + s.q.numel()};
  }
  static std::vector<uint8_t> cache_bytes(const Scene& s) {
    const TensorView buffer = s.pool->index_buffer(kLayer);
    const auto* bytes = buffer.data_as<uint8_t>();
    return {bytes, bytes + buffer.numel()};
  }

  std::vector<int32_t> run(cudaStream_t stream = nullptr) {
    out.fill_bytes(0x7f);  // on the legacy stream: finish it before a launch on another stream
    CUDA_CHECK(cudaDeviceSynchronize());
    ck::launch_indexer_topk(p, stream);
    CUDA_CHECK(cudaDeviceSynchronize());
    return out.download();
  }

  DeviceArray<uint16_t> q;
  DeviceArray<float> weights;
  DeviceArray<uint8_t> cache;
  DeviceArray<int32_t> page_table, token_req, token_pos, out;
  std::unique_ptr<DeviceArray<float>> scores;
  ck::IndexerParams p{};
};

std::vector<int32_t> run_cpu(const Scene& s, int topk) {
  Buffer out(DType::i32, {s.num_tokens(), topk});
  indexer_topk_cpu(s.q, s.weights, *s.pool, kLayer, s.batch, topk, out, default_thread_pool());
  return {out.data_as<int32_t>(), out.data_as<int32_t>() + out.numel()};
}

// The device result of every token against the reference (check_topk) and against the CPU oracle:
// the two choose the same positions except where a position's reference score is within tol of
// the boundary (the k-th best reference score), where either may win.
void expect_device_matches(const Scene& s, int topk, const std::vector<int32_t>& gpu, const std::vector<int32_t>& cpu,
                           const Reference& ref, bool exact_ties) {
  for (int64_t t = 0; t < s.num_tokens(); ++t) {
    const auto ti = static_cast<size_t>(t);
    const auto r = static_cast<size_t>(s.token_req[ti]);
    const std::vector<double>& sc = ref.scores[ti];
    const double tol = ref.tol[ti];
    SCOPED_TRACE("token " + std::to_string(t) + " (request " + std::to_string(r) + ", position " +
                 std::to_string(s.token_pos[ti]) + ")");
    const int32_t* g = gpu.data() + t * topk;
    const int32_t* c = cpu.data() + t * topk;
    ASSERT_TRUE(check_topk(sc, tol, g, topk, exact_ties ? &s.key_ids[r] : nullptr)) << "device";
    ASSERT_TRUE(check_topk(sc, tol, c, topk, exact_ties ? &s.key_ids[r] : nullptr)) << "cpu oracle";
    const int k = std::min<int>(topk, static_cast<int>(sc.size()));
    if (k == 0) continue;
    std::vector<double> sorted = sc;
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
    const double boundary = sorted[static_cast<size_t>(k - 1)];
    std::vector<int32_t> gs(g, g + k), cs(c, c + k), only;
    std::sort(gs.begin(), gs.end());
    std::sort(cs.begin(), cs.end());
    std::set_symmetric_difference(gs.begin(), gs.end(), cs.begin(), cs.end(), std::back_inserter(only));
    for (int32_t x : only) {
      ASSERT_LE(std::fabs(sc[static_cast<size_t>(x)] - boundary), tol)
          << "position " << x << " is chosen by only one of device and CPU, but its score "
          << sc[static_cast<size_t>(x)] << " is not a near-tie of the boundary " << boundary;
    }
  }
}

// Device scores (the workspace after a run) against the reference, within tol / 2.
void expect_scores_match(const Scene& s, DeviceIndexer& d, const Reference& ref) {
  const std::vector<float> scores = d.scores->download();
  const int64_t stride = ck::indexer_score_stride(s.max_kv_len);
  for (int64_t t = 0; t < s.num_tokens(); ++t) {
    const auto& sc = ref.scores[static_cast<size_t>(t)];
    const double tol = ref.tol[static_cast<size_t>(t)] / 2;
    for (size_t j = 0; j < sc.size(); ++j) {
      const double got = scores[static_cast<size_t>(t * stride) + j];
      ASSERT_LE(std::fabs(got - sc[j]), tol) << "token " << t << " position " << j << ": device score " << got
                                             << ", reference " << sc[j];
    }
  }
}

struct DeviceCase {
  std::string name;
  SceneSpec spec;
  std::vector<int> topks;
};

std::vector<DeviceCase> deepseek_cases(std::mt19937_64& rng) {
  std::vector<DeviceCase> cases;
  DeviceCase a;
  a.name = "page64_long";
  a.spec.mode = ForwardMode::EXTEND;
  a.spec.kv_lens = {65536, 8000 + uniform(rng, 0, 192), 3000 + uniform(rng, 0, 100), 1500, 100};
  a.spec.q_lens = {1, 4, 1, 1, 3};  // the 1500-key request has fewer keys than topk 2048: padding
  a.spec.page_size = 64;
  a.topks = {2048, 64};
  cases.push_back(a);
  DeviceCase b;
  b.name = "page1";
  b.spec.mode = ForwardMode::EXTEND;
  b.spec.kv_lens = {8192, 5000 + uniform(rng, 0, 64), 40};
  b.spec.q_lens = {2, 1, 2};
  b.spec.page_size = 1;
  b.topks = {64, 2048};
  cases.push_back(b);
  DeviceCase c;
  c.name = "page16_decode";  // not a multiple of 64: the per-key load path
  c.spec.mode = ForwardMode::DECODE;
  c.spec.kv_lens = {4097, 2000 + uniform(rng, 0, 64), 1, 63};
  c.spec.q_lens = {1, 1, 1, 1};
  c.spec.page_size = 16;
  c.topks = {2048, 64};
  cases.push_back(c);
  DeviceCase v;
  v.name = "verify";
  v.spec.mode = ForwardMode::TARGET_VERIFY;
  v.spec.kv_lens = {6000 + uniform(rng, 0, 64), 2100};
  v.spec.q_lens = {4, 4};
  v.spec.page_size = 64;
  v.topks = {2048};
  cases.push_back(v);
  for (DeviceCase& dc : cases) {
    dc.spec.n_heads = 64;
    dc.spec.dim = 128;
    dc.spec.q_dtype = DType::bf16;
  }
  for (int heads : {32, 128}) {
    DeviceCase h;
    h.name = "heads" + std::to_string(heads);
    h.spec.mode = ForwardMode::EXTEND;
    h.spec.kv_lens = {3000 + uniform(rng, 0, 64), 700};
    h.spec.q_lens = {2, 1};
    h.spec.page_size = 64;
    h.spec.n_heads = heads;
    h.spec.dim = 128;
    h.spec.q_dtype = DType::bf16;
    h.topks = {256};
    cases.push_back(h);
  }
  return cases;
}

TEST(CudaIndexer, MatchesCpuOracleAtDeepSeekShapes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(seed() ^ 0x1d3);
  for (const DeviceCase& dc : deepseek_cases(rng)) {
    SCOPED_TRACE(dc.name);
    const Scene s = make_scene(dc.spec, rng);
    const Reference ref = reference_scores(s);
    for (int topk : dc.topks) {
      SCOPED_TRACE("topk " + std::to_string(topk));
      DeviceIndexer d(s, topk);
      const std::vector<int32_t> gpu = d.run();
      expect_scores_match(s, d, ref);
      expect_device_matches(s, topk, gpu, run_cpu(s, topk), ref, /*exact_ties=*/false);
    }
  }
}

// Keys drawn from a few vectors: many exactly equal scores, so the selection resolves ties by
// position through every path of the radix select (threshold bin in shared memory or, with one
// vector and more than 4096 tied keys, re-read from global memory).
TEST(CudaIndexer, TiesGoToTheLowerPosition) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(seed() ^ 0x71e5);
  for (int distinct : {1, 2, 3}) {
    for (int page_size : {1, 64}) {
      SCOPED_TRACE("distinct keys " + std::to_string(distinct) + " page_size " + std::to_string(page_size));
      SceneSpec spec;
      spec.mode = ForwardMode::EXTEND;
      spec.kv_lens = {8192, 2500 + uniform(rng, 0, 64)};
      spec.q_lens = {1, 2};
      spec.page_size = page_size;
      spec.n_heads = 64;
      spec.dim = 128;
      spec.q_dtype = DType::bf16;
      spec.distinct_keys = distinct;
      const Scene s = make_scene(spec, rng);
      const Reference ref = reference_scores(s);
      for (int topk : {2048, 64}) {
        SCOPED_TRACE("topk " + std::to_string(topk));
        DeviceIndexer d(s, topk);
        const std::vector<int32_t> gpu = d.run();
        const std::vector<int32_t> cpu = run_cpu(s, topk);
        expect_device_matches(s, topk, gpu, cpu, ref, /*exact_ties=*/true);
        if (distinct == 1) {
          EXPECT_EQ(gpu, cpu);  // every score equal: position order, exactly
        }
      }
    }
  }
}

// topk equal to the number of keys of the best vector: the first digit's threshold bin is often
// taken whole (the early exit of the radix select).
TEST(CudaIndexer, TopkEqualToABestGroup) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(seed() ^ 0xb357);
  SceneSpec spec;
  spec.mode = ForwardMode::DECODE;
  spec.kv_lens = {6000};
  spec.q_lens = {1};
  spec.page_size = 64;
  spec.n_heads = 64;
  spec.dim = 128;
  spec.q_dtype = DType::bf16;
  spec.distinct_keys = 2;
  const Scene s = make_scene(spec, rng);
  const Reference ref = reference_scores(s);
  const auto& sc = ref.scores[0];
  const double best = *std::max_element(sc.begin(), sc.end());
  const int topk = std::clamp(static_cast<int>(std::count(sc.begin(), sc.end(), best)), 1, ck::kIndexerMaxTopk);
  DeviceIndexer d(s, topk);
  expect_device_matches(s, topk, d.run(), run_cpu(s, topk), ref, /*exact_ties=*/true);
}

TEST(CudaIndexer, GraphReplayMatchesEagerWithNewPositions) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(seed() ^ 0x6a4f);
  SceneSpec spec;
  spec.mode = ForwardMode::EXTEND;
  spec.kv_lens = {5000 + uniform(rng, 0, 64), 1200, 3000};
  spec.q_lens = {2, 1, 1};
  spec.page_size = 64;
  spec.n_heads = 64;
  spec.dim = 128;
  spec.q_dtype = DType::bf16;
  const Scene s = make_scene(spec, rng);
  const int topk = 2048;
  DeviceIndexer d(s, topk);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<int32_t> eager = d.run(stream);
  const CudaGraph graph(stream, [&] { ck::launch_indexer_topk(d.p, stream); });
  const auto replay = [&] {
    d.out.fill_bytes(0x7f);
    CUDA_CHECK(cudaDeviceSynchronize());
    graph.launch(stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return d.out.download();
  };
  EXPECT_EQ(replay(), eager);
  // New positions in the same buffer (what a replay with new lengths does); the graph reads them
  // on the device, so its result must equal an eager run on the new positions.
  std::vector<int32_t> shorter = s.token_pos;
  for (size_t t = 0; t < shorter.size(); ++t) shorter[t] = std::max(0, shorter[t] - 1000 * static_cast<int>(t + 1));
  d.token_pos.upload(shorter);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int32_t> graph_short = replay();
  const std::vector<int32_t> eager_short = d.run(stream);
  EXPECT_EQ(graph_short, eager_short);
  EXPECT_NE(graph_short, eager);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaIndexer, SelectionRejectsUnsupportedShapes) {
  ck::IndexerParams p{};
  p.num_tokens = 1;
  p.n_heads = 64;
  p.index_head_dim = 128;
  p.page_size = 64;
  p.max_pages = 1;
  p.max_kv_len = 64;
  p.topk = 2048;
  EXPECT_TRUE(ck::select_indexer(p).unsupported.empty());
  EXPECT_EQ(ck::select_indexer(p).workspace_bytes, ck::indexer_workspace_bytes(1, 64));
  for (auto mutate : std::vector<void (*)(ck::IndexerParams&)>{
           [](ck::IndexerParams& q) { q.n_heads = 16; }, [](ck::IndexerParams& q) { q.index_head_dim = 64; },
           [](ck::IndexerParams& q) { q.topk = 0; }, [](ck::IndexerParams& q) { q.topk = ck::kIndexerMaxTopk + 1; },
           [](ck::IndexerParams& q) { q.page_size = 0; }}) {
    ck::IndexerParams bad = p;
    mutate(bad);
    EXPECT_FALSE(ck::select_indexer(bad).unsupported.empty());
    EXPECT_THROW(ck::launch_indexer_topk(bad, nullptr), Error);
  }
}

}  // namespace
}  // namespace specula::testing::indexer
