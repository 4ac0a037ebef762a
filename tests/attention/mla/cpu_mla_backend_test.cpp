// The CPU MLA backend against the float64 reference: every mode, both cache formats, page sizes
// 1 and 64, q_len 1..4 (MTP), tree masks, the chunked-prefix path, sparse indices with -1 padding
// and out-of-range entries, sinks, 16/64/128 query heads, f32 and bf16 queries.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "mla_fixture.h"
#include "specula/attention/mla/cpu/cpu_mla_backend.h"
#include "specula/core/error.h"

namespace specula::testing {
namespace {

uint64_t seed() {
  static const uint64_t s = std::random_device{}();
  return s;
}

using NamedCase = NamedMlaCase;

std::vector<NamedCase> cases() {
  std::mt19937_64 rng(seed());
  std::vector<NamedCase> all;
  for (MlaKVFormat fmt : {MlaKVFormat::bf16, MlaKVFormat::fp8_ds_mla}) {
    const std::string f = fmt == MlaKVFormat::bf16 ? "Bf16" : "Fp8";
    for (int ps : {1, 64}) {
      const std::string p = "Page" + std::to_string(ps);
      MlaCase d;
      d.mode = ForwardMode::DECODE;
      d.prefix_lens = random_lens(rng, 4, 0, 300);
      d.extend_lens = {1, 1, 1, 1};
      d.page_size = ps;
      d.format = fmt;
      all.push_back({"Decode" + f + p, d});

      MlaCase e = d;
      e.mode = ForwardMode::EXTEND;
      e.prefix_lens = random_lens(rng, 3, 0, 150);
      e.prefix_lens[0] = 0;
      e.extend_lens = random_lens(rng, 3, 1, 40);
      all.push_back({"Extend" + f + p, e});
      e.prefix_chunk_tokens = 32;
      all.push_back({"ExtendChunkedPrefix" + f + p, e});

      for (int q_len = 2; q_len <= 4; ++q_len) {
        MlaCase v = d;
        v.mode = ForwardMode::TARGET_VERIFY;
        v.prefix_lens = random_lens(rng, 3, 1, 200);
        v.extend_lens.assign(3, q_len);
        all.push_back({"VerifyCausalQlen" + std::to_string(q_len) + f + p, v});
      }
      MlaCase t = d;
      t.mode = ForwardMode::TARGET_VERIFY;
      t.prefix_lens = random_lens(rng, 3, 1, 200);
      t.extend_lens.assign(3, 7);
      t.tree_mask = true;
      all.push_back({"VerifyTree" + f + p, t});

      MlaCase s = d;
      s.topk = 48;
      s.sinks = true;
      all.push_back({"SparseDecodeSinks" + f + p, s});
      MlaCase se = e;
      se.prefix_chunk_tokens = 0;
      se.topk = 32;
      all.push_back({"SparseExtend" + f + p, se});
    }
  }
  MlaCase bf;
  bf.mode = ForwardMode::DRAFT_EXTEND;
  bf.prefix_lens = random_lens(rng, 3, 5, 100);
  bf.extend_lens = random_lens(rng, 3, 1, 4);
  bf.q_dtype = DType::bf16;
  bf.sinks = true;
  all.push_back({"DraftExtendBf16QuerySinks", bf});
  for (int heads : {64, 128}) {
    MlaCase h;
    h.mode = ForwardMode::TARGET_VERIFY;
    h.num_q_heads = heads;
    h.prefix_lens = random_lens(rng, 2, 1, 64);
    h.extend_lens = {2, 2};
    h.page_size = 64;
    h.format = MlaKVFormat::fp8_ds_mla;
    all.push_back({"Heads" + std::to_string(heads), h});
  }
  MlaCase small;
  small.mode = ForwardMode::EXTEND;
  small.kv_lora_rank = 128;
  small.qk_rope_head_dim = 32;
  small.num_q_heads = 4;
  small.prefix_lens = {9, 0};
  small.extend_lens = {5, 3};
  small.format = MlaKVFormat::fp8_ds_mla;
  all.push_back({"SmallRank128", small});
  return all;
}

class CpuMla : public ::testing::TestWithParam<NamedCase> {};

TEST_P(CpuMla, MatchesFloat64Reference) {
  const MlaCase& c = GetParam().c;
  SCOPED_TRACE("seed " + std::to_string(seed()));
  MlaFixture fx(c, Device::cpu(), seed());
  auto backend = make_mla_backend("cpu", fx.backend_options());
  const MlaResult got = fx.run(*backend);
  const MlaResult want = fx.reference();
  const bool bf16 = c.q_dtype == DType::bf16;
  double worst = 0.0;
  for (size_t i = 0; i < want.out.size(); ++i) {
    const double tol = bf16 ? 1e-3 + 8e-3 * std::abs(want.out[i]) : 2e-5 + 1e-4 * std::abs(want.out[i]);
    const double err = std::abs(got.out[i] - want.out[i]);
    worst = std::max(worst, err);
    ASSERT_LE(err, tol) << "output element " << i << ": got " << got.out[i] << " want " << want.out[i];
  }
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      ASSERT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << "lse " << i << " should be -inf, got " << got.lse[i];
      continue;
    }
    ASSERT_NEAR(got.lse[i], want.lse[i], 1e-4 + 1e-5 * std::abs(want.lse[i])) << "lse " << i;
  }
  // Random inputs must produce real outputs (a backend writing nothing would pass a zero reference).
  double norm = 0.0;
  for (double v : want.out) norm += std::abs(v);
  EXPECT_GT(norm, 0.0);
  RecordProperty("max_abs_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuMla, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<NamedCase>& info) { return info.param.name; });

MlaLayer good_layer() {
  MlaLayer l;
  l.num_q_heads = 16;
  l.scaling = 0.1f;
  return l;
}

TEST(CpuMlaErrors, LayerProblemsNameTheValue) {
  CpuMlaBackend backend(MlaBackendOptions{});
  MlaLayer l = good_layer();
  l.scaling = 0.0f;
  EXPECT_THROW(
      {
        try {
          backend.check_layer(l, DType::bf16, MlaKVFormat::bf16);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("scaling 0"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  l = good_layer();
  l.sinks = {1.0f, 2.0f};
  EXPECT_THROW(backend.check_layer(l, DType::bf16, MlaKVFormat::bf16), Error);
  l = good_layer();
  l.kv_lora_rank = 200;
  EXPECT_NO_THROW(backend.check_layer(l, DType::bf16, MlaKVFormat::bf16));
  EXPECT_THROW(backend.check_layer(l, DType::bf16, MlaKVFormat::fp8_ds_mla), Error);
  EXPECT_THROW(backend.check_layer(good_layer(), DType::i32, MlaKVFormat::bf16), Error);
  EXPECT_THROW(make_mla_backend("flashmla", MlaBackendOptions{}), Error);
}

TEST(CpuMlaErrors, ForwardNeedsMetadataAndShapes) {
  MLAKVPoolConfig pc;
  pc.num_slots = 32;
  pc.num_layers = 1;
  MLAKVPool pool(pc);
  ReqToTokenPool req_pool(2, 16);
  const std::vector<int32_t> slots = {5, 6, 7};
  req_pool.write(0, 0, slots);
  ForwardBatch batch;
  batch.forward_mode = ForwardMode::DECODE;
  batch.batch_size = 1;
  batch.req_pool_indices = {0};
  batch.seq_lens = {3};
  batch.out_cache_loc = {7};
  batch.input_ids = {1};
  batch.positions = {2};
  batch.req_to_token_pool = &req_pool;
  batch.mla_kv_pool = &pool;
  MlaBackendOptions options;
  options.page_size = 1;
  CpuMlaBackend backend(options);
  MlaLayer layer = good_layer();
  layer.layer_id = 0;
  Buffer q(DType::f32, {1, 16, 576});
  Buffer kv_c(DType::f32, {1, 512});
  Buffer k_pe(DType::f32, {1, 64});
  Buffer out(DType::f32, {1, 16, 512});
  for (Buffer* b : {&q, &kv_c, &k_pe}) {
    for (int64_t i = 0; i < b->numel(); ++i) b->data_as<float>()[i] = 0.01f * static_cast<float>(i % 97);
  }
  EXPECT_THROW(backend.forward(q, kv_c, k_pe, out, layer, batch, {}), Error);
  backend.init_forward_metadata(batch);
  Buffer bad_q(DType::f32, {1, 16, 512});
  EXPECT_THROW(backend.forward(bad_q, kv_c, k_pe, out, layer, batch, {}), Error);
  layer.layer_id = 3;
  EXPECT_THROW(backend.forward(q, kv_c, k_pe, out, layer, batch, {}), Error);
  layer.layer_id = 0;
  EXPECT_NO_THROW(backend.forward(q, kv_c, k_pe, out, layer, batch, {}));
  batch.mla_kv_pool = nullptr;
  EXPECT_THROW(backend.init_forward_metadata(batch), Error);
}

}  // namespace
}  // namespace specula::testing
