// The GPU mixture-of-experts layer (CudaMoe and its kernels) against the CPU layer (cpu_moe,
// itself checked against float64 model definitions in deepseek_test / architectures_test): the
// router's picks and weights exactly, ties included, for every routing method; whole layers over
// 1..4096 tokens (experts that receive no token, every tile shape), with and without shared
// experts. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device.h"
#include "specula/model/cpu_ops.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/cuda_moe.h"
#include "specula/model/cuda/decoder_layer.h"
#include "specula/model/cuda/moe_kernels.h"
#include "specula/model/fp8_weights.h"
#include "specula/model/moe.h"
#include "specula/model/weights.h"
#include "tiny_checkpoint.h"

namespace specula {
namespace {

std::vector<float> normal(std::mt19937& rng, size_t n, float scale, bool bf16) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16 ? test::round_bf16(d(rng)) : d(rng);
  return v;
}

struct Routing {
  std::string name;
  int experts = 8, top_k = 2, groups = 1, top_groups = 1, shared = 0;
  MoeConfig::TopK method = MoeConfig::TopK::kGreedy;
  bool sigmoid = false, norm = false, norm_single = false, scale_always = false;
  double scaling = 1.0;
};

MoeConfig moe_config(const Routing& r, int inter) {
  MoeConfig m;
  m.n_routed_experts = r.experts;
  m.num_experts_per_tok = r.top_k;
  m.n_shared_experts = r.shared;
  m.moe_intermediate_size = inter;
  m.n_group = r.groups;
  m.topk_group = r.top_groups;
  m.topk_method = r.method;
  m.sigmoid = r.sigmoid;
  m.norm_topk_prob = r.norm;
  m.norm_single = r.norm_single;
  m.scale_always = r.scale_always;
  m.routed_scaling_factor = r.scaling;
  return m;
}

// DeepSeek-V2 (softmax, greedy, 2 shared, no renormalisation, x16), V2 with group limits,
// V3 (sigmoid, noaux_tc over groups, bias, renormalised then x2.5), Qwen3-MoE (128 experts, top
// 8, renormalised), Mixtral (8 experts, top 2) and a single-expert pick.
std::vector<Routing> routings() {
  using T = MoeConfig::TopK;
  return {Routing{"DeepseekV2", 64, 6, 1, 1, 2, T::kGreedy, false, false, false, false, 16.0},
          Routing{"DeepseekV2Groups", 32, 4, 8, 3, 1, T::kGroupLimited, false, false, false, false, 1.0},
          Routing{"DeepseekV3", 64, 8, 8, 4, 1, T::kNoAuxTc, true, true, false, true, 2.5},
          Routing{"Qwen3Moe", 128, 8, 1, 1, 0, T::kGreedy, false, true, true},
          Routing{"Mixtral", 8, 2, 1, 1, 0, T::kGreedy, false, true, true},
          Routing{"TopOne", 16, 1, 1, 1, 1, T::kGreedy, true, true, false}};
}

// The gap between the last expert picked and the first left out (and likewise for groups), in
// double from the same logits: below a few 1e-6 the GPU's scores may order two experts the other
// way, and such a token is not compared.
double routing_margin(const MoeConfig& m, const float* logits, const std::vector<float>& bias) {
  const int E = m.n_routed_experts;
  std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  double top = *std::max_element(logits, logits + E), z = 0;
  for (int e = 0; e < E; ++e) z += std::exp(double{logits[e]} - top);
  for (int e = 0; e < E; ++e) {
    score[static_cast<size_t>(e)] = m.sigmoid ? 1.0 / (1.0 + std::exp(-double{logits[e]})) : std::exp(double{logits[e]} - top) / z;
    choice[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + (bias.empty() ? 0.0 : bias[static_cast<size_t>(e)]);
  }
  double margin = INFINITY;
  auto gap = [&](std::vector<double> v, int k) {
    std::sort(v.begin(), v.end(), std::greater<>());
    if (k < static_cast<int>(v.size())) margin = std::min(margin, v[static_cast<size_t>(k - 1)] - v[static_cast<size_t>(k)]);
  };
  if (m.topk_method != MoeConfig::TopK::kGreedy) {
    const int per = E / m.n_group;
    std::vector<double> groups(static_cast<size_t>(m.n_group));
    for (int g = 0; g < m.n_group; ++g) {
      std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(v.begin(), v.end(), std::greater<>());
      groups[static_cast<size_t>(g)] = m.topk_method == MoeConfig::TopK::kNoAuxTc ? v[0] + v[1] : v[0];
      // The two best inside a group decide its rank.
      if (m.topk_method == MoeConfig::TopK::kNoAuxTc && per > 2) margin = std::min(margin, v[1] - v[2]);
    }
    gap(groups, m.topk_group);
    std::vector<int> order(static_cast<size_t>(m.n_group));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return groups[static_cast<size_t>(a)] > groups[static_cast<size_t>(b)]; });
    std::vector<double> kept;
    for (int i = 0; i < m.topk_group; ++i) {
      const int g = order[static_cast<size_t>(i)];
      kept.insert(kept.end(), choice.begin() + g * per, choice.begin() + (g + 1) * per);
    }
    gap(kept, m.num_experts_per_tok);
  } else {
    gap(choice, m.num_experts_per_tok);
  }
  return margin;
}

class CudaMoeRoute : public ::testing::TestWithParam<Routing> {};

// Logits drawn from a few values make many exact ties: the picks must still agree (ties go to
// the lower index on both sides).
TEST_P(CudaMoeRoute, PicksTheCpuExpertsAndWeightsTiesIncluded) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Routing& r = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(testing::test_seed("cuda_model_test")));
  const MoeConfig m = moe_config(r, 32);
  const int64_t n = 300;
  const int E = r.experts, k = r.top_k;
  std::vector<float> logits(static_cast<size_t>(n * E));
  std::uniform_int_distribution<int> level(-6, 6);
  std::normal_distribution<float> d(0.0f, 1.5f);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = i < logits.size() / 2 ? 0.25f * level(rng) : d(rng);
  std::vector<float> bias;
  if (r.method == MoeConfig::TopK::kNoAuxTc) {
    for (int e = 0; e < E; ++e) bias.push_back(0.125f * static_cast<float>(level(rng)));
  }
  MoeRoute want;
  moe_route(m, logits.data(), bias, n, want);

  const Device dev = Device::cuda(0);
  const Buffer d_logits = upload_f32(logits, dev), d_bias = upload_f32(bias, dev);
  // The shared experts come after each token's picks: experts E.., weight 1.
  const int stride = k + r.shared;
  Buffer ids(DType::i32, {n * stride}, dev), weights(DType::f32, {n * stride}, dev);
  cuda_kernels::MoeRouteParams p;
  p.logits = d_logits.data_as<const float>();
  p.bias = bias.empty() ? nullptr : d_bias.data_as<const float>();
  p.n = n;
  p.experts = E;
  p.top_k = k;
  p.groups = r.groups;
  p.top_groups = r.top_groups;
  p.method = static_cast<int>(r.method);
  p.sigmoid = r.sigmoid;
  p.normalise = r.norm && (k > 1 || r.norm_single);
  p.scale = r.scale_always;
  p.scaling_factor = r.scaling;
  p.shared = r.shared;
  p.ids = ids.data_as<int32_t>();
  p.weights = weights.data_as<float>();
  cuda_kernels::moe_route(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> got_ids(static_cast<size_t>(n * stride));
  std::vector<float> got_w(got_ids.size());
  copy(TensorView(got_ids.data(), DType::i32, {n * stride}), ids);
  copy(TensorView(got_w.data(), DType::f32, {n * stride}), weights);
  int differing = 0;
  std::vector<int> used(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const size_t g = static_cast<size_t>(t * stride + j), w = static_cast<size_t>(t * k + j);
      if (got_ids[g] != want.experts[w]) {
        ++differing;
        continue;
      }
      used[static_cast<size_t>(got_ids[g])] = 1;
      EXPECT_NEAR(got_w[g], want.weights[w], 2e-7 * std::max(1.0f, std::fabs(want.weights[w]))) << "token " << t;
    }
    for (int j = 0; j < r.shared; ++j) {
      EXPECT_EQ(got_ids[static_cast<size_t>(t * stride + k + j)], E + j) << "token " << t;
      EXPECT_EQ(got_w[static_cast<size_t>(t * stride + k + j)], 1.0f) << "token " << t;
    }
  }
  EXPECT_EQ(differing, 0) << "token 0 picks " << got_ids[0] << " / " << want.experts[0];
  // Real routing happened: the picks are spread over the experts.
  EXPECT_GE(std::accumulate(used.begin(), used.end(), 0), std::min(E, 8));
}

// A NaN logit (an overflowed activation) still routes to valid experts; the weights are NaN, as
// on the CPU, and nothing out of range reaches the sort.
TEST(CudaMoeRouteNan, ANanLogitPicksValidExperts) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int E = 64, k = 6;
  std::vector<float> logits(static_cast<size_t>(E), 0.5f);
  logits[7] = NAN;
  const Device dev = Device::cuda(0);
  const Buffer d_logits = upload_f32(logits, dev);
  Buffer ids(DType::i32, {k}, dev), weights(DType::f32, {k}, dev);
  cuda_kernels::MoeRouteParams p;
  p.logits = d_logits.data_as<const float>();
  p.n = 1;
  p.experts = E;
  p.top_k = k;
  p.ids = ids.data_as<int32_t>();
  p.weights = weights.data_as<float>();
  cuda_kernels::moe_route(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> got(static_cast<size_t>(k));
  copy(TensorView(got.data(), DType::i32, {k}), ids);
  std::set<int32_t> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(k));
  for (int32_t e : got) EXPECT_TRUE(e >= 0 && e < E) << e;
}

INSTANTIATE_TEST_SUITE_P(All, CudaMoeRoute, ::testing::ValuesIn(routings()),
                         [](const auto& info) { return info.param.name; });

struct LayerCase {
  Routing routing;
  int hidden = 128, inter = 96;
  std::vector<int64_t> tokens;
};

// A layer's router, bias, routed and shared experts drawn at random (bf16 values).
MoeWeights random_layer(std::mt19937& rng, const MoeConfig& m, int h) {
  const int E = m.n_routed_experts;
  MoeWeights w;
  w.layer = true;
  w.router = normal(rng, static_cast<size_t>(E) * h, 0.3f, true);
  if (m.topk_method == MoeConfig::TopK::kNoAuxTc) w.correction_bias = normal(rng, static_cast<size_t>(E), 0.05f, false);
  auto expert = [&](int inter, float scale) {
    ExpertWeights e;
    e.inter = inter;
    e.w_gate = normal(rng, static_cast<size_t>(inter) * h, scale, true);
    e.w_up = normal(rng, static_cast<size_t>(inter) * h, scale, true);
    e.w_down = normal(rng, static_cast<size_t>(h) * inter, scale, true);
    return e;
  };
  for (int e = 0; e < E; ++e) w.experts.push_back(expert(m.moe_intermediate_size, 0.15f));
  if (m.n_shared_experts > 0) w.shared = expert(m.n_shared_experts * m.moe_intermediate_size, 0.1f);
  return w;
}

class CudaMoeLayer : public ::testing::TestWithParam<LayerCase> {};

// The large tile's expert outputs (every row of the block list, padding included) from warpgroup
// MMA (with and without paired blocks), from mma.sync and from bf16 activations, over the routing
// the last forward left: the two
// f32-accurate kernels within 1e-5 of each row's scale; bf16 activations (bench moe's peer-style
// variant) within bf16's rounding, 2e-2.
void expect_variants_agree(const CudaMoe& moe, int64_t n, int h, const CudaLayerScratch& scratch,
                           cudaStream_t stream) {
  using Variant = CudaMoe::GemmVariant;
  const Buffer& y = scratch.ws.slots[kMoeY];
  // The rows of the blocks in use (the slot may be larger, rows past them written by no variant).
  int32_t blocks = 0;
  CUDA_CHECK(cudaMemcpy(&blocks, scratch.ws.slots[kMoeBlocks].data(), sizeof(blocks), cudaMemcpyDeviceToHost));
  const int64_t rows = static_cast<int64_t>(blocks) * cuda_kernels::moe_tile_rows(cuda_kernels::MoeTile::kLarge);
  ASSERT_LE(rows * h, y.numel());
  // The whole slot comes back (copy takes whole buffers); the rows past the blocks are not compared.
  auto run = [&](Variant v) {
    moe.grouped_gemms(n, scratch, stream, v);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> out(static_cast<size_t>(y.numel()));
    copy(TensorView(out.data(), DType::f32, {y.numel()}), y);
    return out;
  };
  const std::vector<float> wgmma = run(Variant::automatic), mma = run(Variant::mma_sync),
                           bf16 = run(Variant::bf16_activations), unpaired = run(Variant::unpaired);
  // Sharing the rows' loads between paired blocks changes no arithmetic.
  for (size_t i = 0; i < wgmma.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(wgmma[i]), std::bit_cast<uint32_t>(unpaired[i])) << "value " << i;
  }
  double worst_mma = 0, worst_bf16 = 0, scale = 0;
  int64_t compared = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double row_scale = 0, err_mma = 0, err_bf16 = 0;
    for (int64_t i = r * h; i < (r + 1) * h; ++i) {
      const auto at = static_cast<size_t>(i);
      ASSERT_TRUE(std::isfinite(wgmma[at]) && std::isfinite(bf16[at])) << "row " << r;
      row_scale = std::max(row_scale, std::fabs(double{mma[at]}));
      err_mma = std::max(err_mma, std::fabs(double{wgmma[at]} - mma[at]));
      err_bf16 = std::max(err_bf16, std::fabs(double{bf16[at]} - mma[at]));
    }
    if (row_scale == 0) {
      EXPECT_EQ(err_mma + err_bf16, 0.0) << "padding row " << r;
      continue;
    }
    ++compared;
    scale = std::max(scale, row_scale);
    worst_mma = std::max(worst_mma, err_mma / row_scale);
    worst_bf16 = std::max(worst_bf16, err_bf16 / row_scale);
    EXPECT_LT(err_mma, 1e-5 * row_scale) << "row " << r << " of " << rows;
    EXPECT_LT(err_bf16, 2e-2 * row_scale) << "row " << r << " of " << rows;
  }
  EXPECT_GE(compared, n);
  EXPECT_GT(scale, 0.05);
  EXPECT_GT(worst_bf16, worst_mma);  // the lo term does matter
  std::printf("  large tile, %lld rows (%lld not padding): warpgroup MMA vs mma.sync %.2e, bf16 activations %.2e of "
              "the row's scale\n",
              static_cast<long long>(rows), static_cast<long long>(compared), worst_mma, worst_bf16);
}

// The small tile's kernels (warpgroup MMA with the weights as the M side, at both pipeline depths,
// and mma.sync) give the same bits for every row of the blocks in use, padding rows included, over
// the routing the last forward left. Before each run the expert outputs and the activations
// between the two products are filled with NaN bits, so that whatever a kernel leaves unwritten
// cannot pass for the previous run's values.
void expect_small_tile_kernels_agree(const CudaMoe& moe, int64_t n, int h, const CudaLayerScratch& scratch,
                                     cudaStream_t stream) {
  const Buffer& y = scratch.ws.slots[kMoeY];
  const Buffer& act = scratch.ws.slots[kMoeAct];
  int32_t blocks = 0;
  CUDA_CHECK(cudaMemcpy(&blocks, scratch.ws.slots[kMoeBlocks].data(), sizeof(blocks), cudaMemcpyDeviceToHost));
  const int64_t rows = static_cast<int64_t>(blocks) * cuda_kernels::moe_tile_rows(cuda_kernels::MoeTile::kSmall);
  ASSERT_LE(rows * h, y.numel());
  auto run = [&](CudaMoe::GemmVariant v) {
    CUDA_CHECK(cudaMemsetAsync(y.data(), 0xff, y.nbytes(), stream));
    CUDA_CHECK(cudaMemsetAsync(act.data(), 0xff, act.nbytes(), stream));
    moe.grouped_gemms(n, scratch, stream, v);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> out(static_cast<size_t>(y.numel()));
    copy(TensorView(out.data(), DType::f32, {y.numel()}), y);
    return out;
  };
  const std::vector<float> mma = run(CudaMoe::GemmVariant::mma_sync);
  double scale = 0;
  for (int64_t i = 0; i < rows * h; ++i) {
    const float v = mma[static_cast<size_t>(i)];
    ASSERT_TRUE(std::isfinite(v)) << "mma.sync left row " << i / h << " column " << i % h << " unwritten";
    scale = std::max(scale, std::fabs(double{v}));
  }
  EXPECT_GT(scale, 0.05);
  for (CudaMoe::GemmVariant v : {CudaMoe::GemmVariant::decode_shallow, CudaMoe::GemmVariant::decode_deep}) {
    SCOPED_TRACE(v == CudaMoe::GemmVariant::decode_shallow ? "3 stages" : "5 stages");
    const std::vector<float> wgmma = run(v);
    for (int64_t i = 0; i < rows * h; ++i) {
      const auto at = static_cast<size_t>(i);
      ASSERT_EQ(std::bit_cast<uint32_t>(wgmma[at]), std::bit_cast<uint32_t>(mma[at]))
          << "row " << i / h << " column " << i % h << ": " << wgmma[at] << " against " << mma[at];
    }
  }
}

// The whole layer against cpu_moe on bf16 weights (the GPU holds experts in bf16): the GPU's
// f32-accurate activations (hi/lo split) leave differences near 1e-5 of the output's scale.
TEST_P(CudaMoeLayer, MatchesTheCpuLayer) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const LayerCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(testing::test_seed("cuda_model_test")) ^ 0x5eed);
  const MoeConfig m = moe_config(c.routing, c.inter);
  const int h = c.hidden, E = m.n_routed_experts;
  const MoeWeights w = random_layer(rng, m, h);
  const Device dev = Device::cuda(0);
  const CudaMoe moe(m, w, nullptr, "", h, dev);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  CudaLinear linear(dev, stream, false);
  CudaLayerScratch scratch;
  const CudaStepLinear step{linear, scratch, dev};
  for (int64_t n : c.tokens) {
    SCOPED_TRACE(::testing::Message() << c.routing.name << " tokens=" << n);
    // Tokens are drawn again while their routing is near a tie (below 1e-4 a rounding
    // difference could pick another expert); what remains near one is not compared.
    std::vector<float> x(static_cast<size_t>(n * h)), logits(static_cast<size_t>(n * E));
    std::vector<char> near_tie(static_cast<size_t>(n), 1);
    for (int64_t t = 0; t < n; ++t) {
      for (int attempt = 0; attempt < 50 && near_tie[static_cast<size_t>(t)]; ++attempt) {
        const std::vector<float> row = normal(rng, static_cast<size_t>(h), 1.0f, false);
        std::copy(row.begin(), row.end(), x.begin() + t * h);
        cpu_linear(row.data(), w.router, logits.data() + t * E, 1, h, E);
        near_tie[static_cast<size_t>(t)] = routing_margin(m, logits.data() + t * E, w.correction_bias) < 1e-4;
      }
    }
    std::vector<float> want(x.size());
    cpu_moe(m, w, x.data(), n, h, want.data());

    const Buffer d_x = upload_f32(x, dev);
    Buffer d_out(DType::f32, {n * h}, dev);
    moe.forward(d_x.data_as<const float>(), d_out.data_as<float>(), n, step, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> got(x.size());
    copy(TensorView(got.data(), DType::f32, {n * h}), d_out);

    int64_t compared = 0;
    double worst = 0, scale = 0;
    for (int64_t t = 0; t < n; ++t) {
      if (near_tie[static_cast<size_t>(t)]) continue;
      ++compared;
      double row_scale = 0, row_err = 0;
      for (int i = 0; i < h; ++i) {
        const size_t at = static_cast<size_t>(t * h + i);
        ASSERT_TRUE(std::isfinite(got[at])) << "token " << t;
        row_scale = std::max(row_scale, std::fabs(double{want[at]}));
        row_err = std::max(row_err, std::fabs(double{got[at]} - want[at]));
      }
      scale = std::max(scale, row_scale);
      worst = std::max(worst, row_err / std::max(row_scale, 1e-3));
      EXPECT_LT(row_err, 2e-4 * std::max(row_scale, 1e-3)) << "token " << t << " of " << n;
    }
    EXPECT_GE(compared, n - std::max<int64_t>(1, n / 50)) << "too many near-tied routings";
    EXPECT_GT(scale, 0.05);
    std::printf("%s, %lld tokens: %lld compared, worst row error %.2e of the row's scale\n", c.routing.name.c_str(),
                static_cast<long long>(n), static_cast<long long>(compared), worst);
    const int64_t pairs = n * (m.num_experts_per_tok + m.n_shared_experts);
    const cuda_kernels::MoeTile tile = cuda_kernels::moe_pick_tile(pairs, E + m.n_shared_experts);
    if (tile == cuda_kernels::MoeTile::kLarge) expect_variants_agree(moe, n, h, scratch, stream);
    if (tile == cuda_kernels::MoeTile::kSmall) expect_small_tile_kernels_agree(moe, n, h, scratch, stream);
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  for (const Routing& r : routings()) cases.push_back(LayerCase{r, 128, 96, {1, 3, 37, 300}});
  // Every tile: the small (decode), medium and large (prefill) ones, up to 4096 tokens; widths
  // that are not multiples of 32 (padded inter) or of the tile.
  cases.push_back(LayerCase{routings()[4], 136, 40, {1, 64, 700, 4096}});
  cases.push_back(LayerCase{routings()[0], 64, 1408 / 8, {5, 1024}});
  // Decode over many k tiles (gate|up 18 of 64, the last one 8 wide; down 12, the last 32 wide):
  // the small tile's ring of 3 or 5 stages wraps around more than twice.
  cases.push_back(LayerCase{routings()[4], 1096, 712, {1, 8}});
  // Several waves of paired large-tile blocks (gate|up 144 clusters of two, down 72, where an
  // H200 runs at most 66 at once).
  cases.push_back(LayerCase{routings()[4], 512, 512, {4096}});
  return cases;
}

void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.routing.name << "_h" << c.hidden << "_i" << c.inter; }

INSTANTIATE_TEST_SUITE_P(All, CudaMoeLayer, ::testing::ValuesIn(layer_cases()), [](const auto& info) {
  return info.param.routing.name + "_h" + std::to_string(info.param.hidden) + "_i" + std::to_string(info.param.inter);
});

// Decode's small tile gives a token the bits it gets inside a prefill-sized batch (the medium
// tile, and the large one on warpgroup MMA): each row's arithmetic is the same whatever shares
// its step. The router's product is the GEMV at every row count (deterministic mode), as it is
// batch invariant itself.
TEST_P(CudaMoeLayer, DecodeRowsEqualTheirRowsInALargerBatch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const LayerCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(testing::test_seed("cuda_model_test")) ^ 0xdec0de);
  const MoeConfig m = moe_config(c.routing, c.inter);
  const int h = c.hidden;
  const CudaMoe moe(m, random_layer(rng, m, h), nullptr, "", h, Device::cuda(0));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  CudaLinear linear(Device::cuda(0), stream, true);
  CudaLayerScratch scratch;
  const CudaStepLinear step{linear, scratch, Device::cuda(0)};
  auto forward = [&](const std::vector<float>& x, int64_t n) {
    const Buffer d_x = upload_f32(std::vector<float>(x.begin(), x.begin() + n * h), Device::cuda(0));
    Buffer d_out(DType::f32, {n * h}, Device::cuda(0));
    moe.forward(d_x.data_as<const float>(), d_out.data_as<float>(), n, step, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> out(static_cast<size_t>(n * h));
    copy(TensorView(out.data(), DType::f32, {n * h}), d_out);
    return out;
  };
  // A batch on the large tile (warpgroup MMA), and one of 300 tokens (the medium tile here).
  const int64_t per_token = m.num_experts_per_tok + m.n_shared_experts,
                stacked = m.n_routed_experts + m.n_shared_experts;
  const int64_t large = std::max<int64_t>(300, (97 * stacked + per_token - 1) / per_token);
  ASSERT_EQ(cuda_kernels::moe_pick_tile(large * per_token, static_cast<int>(stacked)), cuda_kernels::MoeTile::kLarge);
  const std::vector<float> x = normal(rng, static_cast<size_t>(large * h), 1.0f, false);
  const std::vector<float> all = forward(x, large);
  double scale = 0;
  for (float v : all) scale = std::max(scale, std::fabs(double{v}));
  EXPECT_GT(scale, 0.05);
  for (int64_t n : {int64_t{300}, int64_t{1}, int64_t{3}, int64_t{16}, int64_t{64}}) {
    SCOPED_TRACE(::testing::Message() << c.routing.name << " tokens=" << n);
    ASSERT_EQ(cuda_kernels::moe_pick_tile(n * per_token, static_cast<int>(stacked)),
              n == 300 ? cuda_kernels::MoeTile::kMedium : cuda_kernels::MoeTile::kSmall);
    const std::vector<float> got = forward(x, n);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(all[i]))
          << "token " << i / static_cast<size_t>(h) << " column " << i % static_cast<size_t>(h) << ": " << got[i]
          << " against " << all[i] << " (in " << large << " tokens)";
    }
    // The padding rows of the blocks in use multiply zeros: their outputs are exactly zero.
    const int bm = cuda_kernels::moe_tile_rows(cuda_kernels::moe_pick_tile(n * per_token, static_cast<int>(stacked)));
    int32_t blocks = 0;
    CUDA_CHECK(cudaMemcpy(&blocks, scratch.ws.slots[kMoeBlocks].data(), sizeof(blocks), cudaMemcpyDeviceToHost));
    const int64_t rows = static_cast<int64_t>(blocks) * bm;
    const Buffer& sorted_slot = scratch.ws.slots[kMoeSorted];
    const Buffer& y_slot = scratch.ws.slots[kMoeY];
    ASSERT_LE(rows * h, y_slot.numel());
    std::vector<int32_t> sorted(static_cast<size_t>(sorted_slot.numel()));
    copy(TensorView(sorted.data(), DType::i32, {sorted_slot.numel()}), sorted_slot);
    std::vector<float> y(static_cast<size_t>(y_slot.numel()));
    copy(TensorView(y.data(), DType::f32, {y_slot.numel()}), y_slot);
    int64_t padding = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (sorted[static_cast<size_t>(r)] >= 0) continue;
      ++padding;
      for (int64_t i = r * h; i < (r + 1) * h; ++i) ASSERT_EQ(y[static_cast<size_t>(i)], 0.0f) << "padding row " << r;
    }
    EXPECT_GT(padding, 0);
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// Tensors held in memory under checkpoint names.
class MapSource final : public WeightSource {
 public:
  std::map<std::string, Buffer> tensors;
  TensorView get(const std::string& name, const Shape& shape) const override {
    const Buffer& b = tensors.at(name);
    EXPECT_EQ(b.shape(), shape) << name;
    return b.view();
  }
  bool contains(const std::string& name) const override { return tensors.count(name) != 0; }
  size_t total_bytes() const override { return 0; }
};

// An fp8 block-scaled matrix in `source` (codes and "<name>_scale_inv"), returned dequantized in f32
// as the checkpoint loader computes it.
std::vector<float> add_fp8(MapSource& source, std::mt19937& rng, const std::string& name, int64_t rows, int64_t cols,
                           int block, float scale) {
  const std::vector<float> v = normal(rng, static_cast<size_t>(rows * cols), scale, false);
  const int64_t br = (rows + block - 1) / block, bc = (cols + block - 1) / block;
  Buffer codes(DType::fp8_e4m3, {rows, cols}), scales(DType::f32, {br, bc});
  auto* q = static_cast<uint8_t*>(codes.data());
  auto* sc = scales.data_as<float>();
  for (int64_t b = 0; b < br * bc; ++b) sc[b] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float& m = sc[(r / block) * bc + c / block];
      m = std::max(m, std::fabs(v[static_cast<size_t>(r * cols + c)]) / 448.0f);
    }
  }
  std::vector<float> dequantized(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float s = sc[(r / block) * bc + c / block];
      q[r * cols + c] = float_to_fp8_e4m3_bits(v[static_cast<size_t>(r * cols + c)] / s);
      dequantized[static_cast<size_t>(r * cols + c)] = fp8_e4m3_bits_to_float(q[r * cols + c]) * s;
    }
  }
  source.tensors.emplace(name, std::move(codes));
  source.tensors.emplace(name + "_scale_inv", std::move(scales));
  return dequantized;
}

struct Fp8Case {
  int shared, h, inter, block;
};

class CudaMoeFp8 : public ::testing::TestWithParam<Fp8Case> {};

// Experts kept in fp8 on the device (codes and block scales, half the bytes) give bit for bit what
// the same experts dequantized to bf16 on the host give, over every tile (mma.sync's, and the
// large one's on warpgroup MMA); the shared experts are split along block edges. Hidden 720 leaves
// a partial column tile (down's 720 rows) and a partial k tile, and the last of its 128-wide
// blocks (the checkpoints' width) ends inside a k tile.
TEST_P(CudaMoeFp8, EqualsTheLayerDequantizedOnTheHostBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int shared = GetParam().shared;
  std::mt19937 rng(static_cast<uint32_t>(testing::test_seed("cuda_model_test")) ^ 0xf8);
  Routing r = routings()[2];  // DeepSeek-V3's routing
  r.experts = 16, r.top_k = 4, r.groups = 4, r.top_groups = 2, r.shared = shared;
  // At hidden 512 the down product's two column tiles pair up as a cluster on warpgroup MMA (the
  // large tile at 1500 tokens), whose producer turns the codes into bf16 tiles; 720's three do not.
  const int h = GetParam().h, inter = GetParam().inter, block = GetParam().block;
  const MoeConfig m = moe_config(r, inter);
  const std::string prefix = "model.layers.3.";
  MapSource source;
  MoeWeights loaded, streamed;
  loaded.layer = streamed.layer = true;
  loaded.router = streamed.router = normal(rng, static_cast<size_t>(r.experts) * h, 0.3f, true);
  loaded.correction_bias = streamed.correction_bias = normal(rng, static_cast<size_t>(r.experts), 0.05f, false);
  for (int e = 0; e < r.experts; ++e) {
    const ExpertNames n = expert_names(prefix, m, e);
    ExpertWeights x;
    x.inter = inter;
    x.w_gate = add_fp8(source, rng, n.gate, inter, h, block, 0.15f);
    x.w_up = add_fp8(source, rng, n.up, inter, h, block, 0.15f);
    x.w_down = add_fp8(source, rng, n.down, h, inter, block, 0.15f);
    loaded.experts.push_back(std::move(x));
  }
  const std::string sp = prefix + "mlp.shared_experts.";
  loaded.shared.inter = shared * inter;
  loaded.shared.w_gate = add_fp8(source, rng, sp + "gate_proj.weight", shared * inter, h, block, 0.1f);
  loaded.shared.w_up = add_fp8(source, rng, sp + "up_proj.weight", shared * inter, h, block, 0.1f);
  loaded.shared.w_down = add_fp8(source, rng, sp + "down_proj.weight", h, shared * inter, block, 0.1f);
  streamed.shared = loaded.shared;
  ModelConfig config;
  config.fp8_block_out = config.fp8_block_in = block;
  const Fp8BlockWeights fp8_source(source, config);
  const Device dev = Device::cuda(0);
  const CudaMoe as_bf16(m, loaded, nullptr, prefix, h, dev);
  const CudaMoe as_fp8(m, streamed, &fp8_source, prefix, h, dev, true);
  // Without keep_fp8 the same source's experts become bf16, the same as the host's.
  EXPECT_FALSE(CudaMoe(m, streamed, &fp8_source, prefix, h, dev).fp8());
  ASSERT_FALSE(as_bf16.fp8());
  ASSERT_TRUE(as_fp8.fp8());
  EXPECT_LT(as_fp8.bytes(), as_bf16.bytes() * 6 / 10);
  CudaLinear linear(dev, nullptr, false);
  CudaLayerScratch scratch;
  const CudaStepLinear step{linear, scratch, dev};
  for (int64_t n : {1, 37, 300, 1500}) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << n);
    const Buffer x = upload_f32(normal(rng, static_cast<size_t>(n * h), 1.0f, false), dev);
    Buffer a(DType::f32, {n * h}, dev), b(DType::f32, {n * h}, dev);
    as_bf16.forward(x.data_as<const float>(), a.data_as<float>(), n, step, nullptr);
    as_fp8.forward(x.data_as<const float>(), b.data_as<float>(), n, step, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> ha(static_cast<size_t>(n * h)), hb(ha.size());
    copy(TensorView(ha.data(), DType::f32, {n * h}), a);
    copy(TensorView(hb.data(), DType::f32, {n * h}), b);
    double scale = 0;
    for (size_t i = 0; i < ha.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(ha[i]), std::bit_cast<uint32_t>(hb[i])) << "value " << i << ": " << ha[i] << " vs " << hb[i];
      scale = std::max(scale, std::fabs(double{ha[i]}));
    }
    EXPECT_GT(scale, 0.01);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeFp8,
                         ::testing::Values(Fp8Case{1, 512, 96, 32}, Fp8Case{2, 512, 96, 32}, Fp8Case{1, 720, 160, 128}),
                         [](const auto& info) {
                           const Fp8Case& c = info.param;
                           return "shared" + std::to_string(c.shared) + "_h" + std::to_string(c.h) + "_i" +
                                  std::to_string(c.inter) + "_block" + std::to_string(c.block);
                         });

}  // namespace
}  // namespace specula
