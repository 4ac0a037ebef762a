// The expanded form of MLA extend on the GPU (forward_expanded): the warpgroup-MMA prefill kernel
// at width 192 / 128 over ragged K/V rows that the host expands from the pool's latent rows,
// against the float64 absorbed reference mapped through W_UV; bf16 and fp8_ds_mla caches, page
// sizes 1 and 64, one pass and many (passes that cut requests, prefix-only passes, partly causal
// ones, merges, a sink in the first pass only); and the per-step choice of the form.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "cuda_test_support.h"
#include "mla_fixture.h"
#include "specula/core/error.h"
#include "specula/attention/mla/cuda/cuda_mla_backend.h"

namespace specula::testing {
namespace {

uint64_t seed() { return test_seed("cuda_mla_expanded_test"); }

std::vector<NamedMlaCase> cases() {
  std::mt19937_64 rng(seed());
  std::vector<NamedMlaCase> all;
  for (MlaKVFormat fmt : {MlaKVFormat::bf16, MlaKVFormat::fp8_ds_mla}) {
    const std::string f = fmt == MlaKVFormat::bf16 ? "Bf16" : "Fp8";
    for (int ps : {1, 64}) {
      const std::string p = "Page" + std::to_string(ps);
      MlaCase e;
      e.mode = ForwardMode::EXTEND;
      e.q_dtype = DType::bf16;
      e.format = fmt;
      e.page_size = ps;
      e.extend_form = MlaExtendForm::expanded;
      e.prefix_lens = random_lens(rng, 3, 0, 300);
      e.prefix_lens[0] = 0;
      e.extend_lens = random_lens(rng, 3, 1, 300);  // several 128-row query tiles
      all.push_back({"OnePass" + f + p, e});
      // Passes of 100 rows: cut inside requests, some all prefix, some partly causal.
      e.expanded_chunk_rows = 100;
      e.sinks = true;
      all.push_back({"Passes100Sinks" + f + p, e});
    }
  }
  MlaCase wide;
  wide.mode = ForwardMode::EXTEND;
  wide.q_dtype = DType::bf16;
  wide.page_size = 64;
  wide.num_q_heads = 128;
  wide.extend_form = MlaExtendForm::expanded;
  wide.prefix_lens = {70, 0};
  wide.extend_lens = {30, 90};
  wide.expanded_chunk_rows = 64;
  all.push_back({"Heads128Passes64", wide});
  return all;
}

class CudaMlaExpanded : public ::testing::TestWithParam<NamedMlaCase> {};

TEST_P(CudaMlaExpanded, MatchesTheAbsorbedFloat64Reference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const MlaCase& c = GetParam().c;
  MlaFixture fx(c, Device::cuda(0), seed());
  const ExpandedInputs e = fx.make_expanded();
  auto backend = make_mla_backend("cuda", fx.backend_options());
  const MlaResult got = fx.run_expanded(*backend, e);
  const MlaResult want = fx.reference_expanded(e);
  ASSERT_EQ(got.out.size(), want.out.size());
  double max_abs = 0.0;
  for (double w : want.out) max_abs = std::max(max_abs, std::abs(w));
  ASSERT_GT(max_abs, 0.1);
  // bf16 keys, values, probabilities and output: a few bf16 steps of the row's scale.
  for (size_t i = 0; i < want.out.size(); ++i) {
    ASSERT_NEAR(got.out[i], want.out[i], 1e-2 * max_abs + 1.5e-2 * std::abs(want.out[i]))
        << GetParam().name << " output " << i;
  }
  for (size_t i = 0; i < want.lse.size(); ++i) {
    ASSERT_NEAR(got.lse[i], want.lse[i], 2e-2 + 2e-3 * std::abs(want.lse[i])) << GetParam().name << " lse " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaMlaExpanded, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<NamedMlaCase>& info) { return info.param.name; });

TEST(CudaMlaExpandedChoice, FreshPromptsExpandDecodeLikeStepsAbsorb) {
  // A fresh prompt saves 3.4x per pair and expands no more rows than the absorbed form absorbs.
  EXPECT_TRUE(prefer_expanded({2048}, {2048}, 128, 128));
  EXPECT_TRUE(prefer_expanded({64}, {64}, 128, 128));
  // One new token against a long prefix: expanding 4096 rows costs far more than it saves.
  EXPECT_FALSE(prefer_expanded({4096}, {1}, 128, 128));
  EXPECT_FALSE(prefer_expanded({4096, 300}, {1, 1}, 128, 128));
  // A chunk of 4096 queries after a 4096 prefix: the pairs dominate.
  EXPECT_TRUE(prefer_expanded({8192}, {4096}, 128, 128));
  // 16 queries after 8192 cached keys: mostly expansion work.
  EXPECT_FALSE(prefer_expanded({8208}, {16}, 128, 128));
}

TEST(CudaMlaExpandedChoice, TheBackendPlansTheFormTheOptionsAsk) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (MlaExtendForm form : {MlaExtendForm::automatic, MlaExtendForm::absorbed, MlaExtendForm::expanded}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      MlaCase c;
      c.mode = mode;
      c.q_dtype = DType::bf16;
      c.page_size = 64;
      c.extend_form = form;
      c.prefix_lens = mode == ForwardMode::EXTEND ? std::vector<int>{0, 0} : std::vector<int>{500, 700};
      c.extend_lens = mode == ForwardMode::EXTEND ? std::vector<int>{200, 300} : std::vector<int>{1, 1};
      MlaFixture fx(c, Device::cuda(0), seed());
      auto backend = make_mla_backend("cuda", fx.backend_options());
      fx.run(*backend);  // the absorbed forward serves every planned step
      const bool want = mode == ForwardMode::EXTEND && form != MlaExtendForm::absorbed;
      EXPECT_EQ(backend->expanded_step(), want) << mla_extend_form_name(form) << " " << forward_mode_name(mode);
    }
  }
}

TEST(CudaMlaExpandedChoice, LayersOfOtherWidthsRefuseAForcedExpandedForm) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  MlaBackendOptions o;
  o.device = Device::cuda(0);
  o.extend_form = MlaExtendForm::expanded;
  auto backend = make_mla_backend("cuda", o);
  MlaLayer layer;
  layer.num_q_heads = 16;
  layer.scaling = 0.1f;
  layer.qk_nope_head_dim = 64;
  try {
    backend->check_layer(layer, DType::bf16, MlaKVFormat::bf16);
    FAIL() << "a 64 + 64 / 128 layer was accepted for the expanded form";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("qk_nope_head_dim + qk_rope_head_dim = 192"), std::string::npos) << err.what();
  }
  layer.qk_nope_head_dim = 128;
  EXPECT_NO_THROW(backend->check_layer(layer, DType::bf16, MlaKVFormat::bf16));
}

}  // namespace
}  // namespace specula::testing
