// Double sparsity on the CPU against the float64 reference that redoes the label scores, the
// heavy-token choice and the attention; and the channel config's errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "ds_harness.h"
#include "specula/core/error.h"

namespace specula {
namespace {

using testing::DsCase;
using testing::DsHarness;
using testing::DsResult;
using testing::max_diff;

struct CpuDsParam {
  const char* name;
  DsCase c;
};

class CpuDoubleSparsity : public ::testing::TestWithParam<CpuDsParam> {};

TEST_P(CpuDoubleSparsity, DecodeMatchesTheFloat64Choice) {
  const DsCase& c = GetParam().c;
  uint64_t seed = 0;
  const std::unique_ptr<DsHarness> h = testing::harness_with_clear_choice(c, seed);
  ASSERT_NE(h, nullptr) << "no draw with a clear heavy-token choice";
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const DsResult got = h->run("cpu", Device::cpu());
  const DsResult want = h->reference();
  const double tol = c.kv_dtype == DType::f32 ? 2e-5 : 1e-4;
  EXPECT_LE(max_diff(got.out, want.out), tol);
  EXPECT_LE(max_diff(got.lse, want.lse), tol);
  if (h->any_sparse_row()) {
    // The sparse rows are not dense attention in disguise.
    EXPECT_GT(max_diff(h->reference(true).out, want.out), 1e-3);
  } else {
    EXPECT_LE(max_diff(got.out, h->reference(true).out), tol);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuDoubleSparsity,
    ::testing::Values(
        // GQA, a request below the threshold between two sparse ones.
        CpuDsParam{"gqa_page1", DsCase{{700, 150, 1100}, 8, 2, 64, 1, DType::f32, DType::f32, 16, 64, 256}},
        // MHA over a bf16 cache in pages of 16, one request exactly at the threshold, soft-cap, sinks.
        CpuDsParam{"mha_page16_bf16", DsCase{{300, 520}, 4, 4, 128, 16, DType::f32, DType::bf16, 8, 32, 300, 30.0f, true}},
        // The caller writes the cache (save_kv_cache = false), as GPU models do: labels still follow.
        CpuDsParam{"caller_writes_kv", DsCase{{700, 400}, 8, 2, 64, 16, DType::f32, DType::bf16, 16, 64, 256, 0.0f,
                                              false, false, true}},
        // Five decode steps, the earlier ones sparse too: their K and labels come from the decode path.
        CpuDsParam{"five_decode_steps", DsCase{{900, 600}, 8, 2, 64, 16, DType::f32, DType::bf16, 16, 64, 256, 0.0f, false,
                                               false, false, 1e-4, 5}},
        // Every label score equal: the lowest positions win.
        CpuDsParam{"tied_scores", DsCase{{600}, 4, 2, 64, 8, DType::f32, DType::f32, 8, 48, 256, 0.0f, false, true}},
        // Label scores equal in groups (12 rows of labels), the count ending inside a group: the
        // group's lower positions, after every higher group.
        CpuDsParam{"grouped_ties", DsCase{{900, 700}, 8, 2, 64, 16, DType::f32, DType::f32, 16, 100, 256, 0.0f, false, false,
                                          false, 1e-4, 1, 12}},
        // Over the threshold but with no more keys than heavy_token_num: every key.
        CpuDsParam{"short_rows_dense", DsCase{{100, 90}, 4, 1, 64, 4, DType::f32, DType::f32, 32, 128, 50}}),
    [](const auto& info) { return std::string(info.param.name); });

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

class DsConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / ("specula_ds_" + std::to_string(std::random_device{}()) + ".json");
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string load(const std::string& text, int heavy_channels = 2) {
    std::ofstream(path_) << text;
    return error_of([&] { load_double_sparsity_config(path_, 2, 2, 8, heavy_channels, 64, 128, "k"); });
  }
  std::filesystem::path path_;
};

TEST_F(DsConfigFile, ReadsEachHeadsFirstChannels) {
  std::ofstream(path_) << R"({"model.layers.0.self_attn.k_proj": [[3, 1, 7], [0, 5, 2]],
                              "model.layers.1.self_attn.k_proj": [[7, 6], [1, 2, 3]],
                              "model.layers.0.self_attn.q_proj": "ignored"})";
  const DoubleSparsityConfig c = load_double_sparsity_config(path_, 2, 2, 8, 2, 64, 128, "k");
  EXPECT_EQ(c.channels, (std::vector<std::vector<int32_t>>{{3, 1, 0, 5}, {7, 6, 1, 2}}));
  EXPECT_EQ(c.heavy_token_num, 64);
  EXPECT_EQ(c.sparse_decode_threshold, 128);
}

TEST_F(DsConfigFile, RefusesBadFilesWithTheKeyAndValue) {
  EXPECT_NE(error_of([&] { load_double_sparsity_config(path_, 2, 2, 8, 2, 64, 128, "k"); }).find("no such file"),
            std::string::npos);
  EXPECT_NE(load(R"({"model.layers.0.self_attn.k_proj": [[0, 1], [2, 3]]})").find(
                "no \"model.layers.1.self_attn.k_proj\"; the model has 2 layers"),
            std::string::npos);
  EXPECT_NE(load(R"({"model.layers.0.self_attn.k_proj": [[0, 1]], "model.layers.1.self_attn.k_proj": [[0, 1], [2, 3]]})")
                .find("must list 2 heads"),
            std::string::npos);
  EXPECT_NE(load(R"({"model.layers.0.self_attn.k_proj": [[0], [2, 3]], "model.layers.1.self_attn.k_proj": [[0, 1], [2, 3]]})")
                .find("at least --ds-heavy-channel-num (2) channels"),
            std::string::npos);
  EXPECT_NE(load(R"({"model.layers.0.self_attn.k_proj": [[0, 8], [2, 3]], "model.layers.1.self_attn.k_proj": [[0, 1], [2, 3]]})")
                .find("out of range [0, 7]"),
            std::string::npos);
  EXPECT_NE(load(R"({"model.layers.0.self_attn.k_proj": [[4, 4], [2, 3]], "model.layers.1.self_attn.k_proj": [[0, 1], [2, 3]]})")
                .find("repeats channel 4"),
            std::string::npos);
  EXPECT_NE(load("{}", 9).find("--ds-heavy-channel-num 9 is out of range; allowed 1 to head_dim (8)"), std::string::npos);
  EXPECT_NE(load("[1, 2]").find("expected an object"), std::string::npos);
  EXPECT_NE(error_of([&] { load_double_sparsity_config(path_, 2, 2, 8, 2, 64, 128, "v"); })
                .find("--ds-heavy-channel-type v is not known; allowed q, k, qk"),
            std::string::npos);
}

TEST(DsBackend, RefusesLayersItCannotServe) {
  auto config = std::make_shared<DoubleSparsityConfig>();
  config->heavy_channel_num = 4;
  config->channels = {std::vector<int32_t>(8, 0)};
  AttentionBackendOptions options;
  options.double_sparsity = config;
  auto backend = make_attention_backend("cpu", options);
  EXPECT_EQ(backend->name(), "double_sparsity");
  AttentionLayer layer;
  layer.num_q_heads = 4;
  layer.num_kv_heads = 2;
  layer.head_dim = 64;
  EXPECT_NO_THROW(backend->check_layer(layer, DType::f32, DType::f32));
  EXPECT_NE(error_of([&] { backend->check_layer(layer, DType::f32, DType::fp8_e4m3); }).find("got fp8_e4m3"),
            std::string::npos);
  AttentionLayer windowed = layer;
  windowed.sliding_window_size = 128;
  EXPECT_NE(error_of([&] { backend->check_layer(windowed, DType::f32, DType::f32); }).find("sliding window"),
            std::string::npos);
  AttentionLayer later = layer;
  later.layer_id = 1;
  EXPECT_NE(error_of([&] { backend->check_layer(later, DType::f32, DType::f32); })
                .find("layer 1 has no label channels; the channel config covers 1 layers"),
            std::string::npos);
}

}  // namespace
}  // namespace specula
