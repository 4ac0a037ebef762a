// The Qwen2-VL vision block through the CPU attention backend against the float64 reference:
// images and a video of different sizes packed in one batch, each frame attending to itself only.
#include <gtest/gtest.h>

#include <random>

#include "specula/core/error.h"
#include "vision_reference.h"

namespace specula {
namespace {

struct VisionParam {
  int hidden, heads, merge, page_size;
  DType kv_dtype;
  double tolerance;
};

class CpuVision : public ::testing::TestWithParam<VisionParam> {};

TEST_P(CpuVision, BlockMatchesFloat64Reference) {
  const VisionParam c = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  // Two images, a two-frame video and a one-window image; the sizes are redrawn each run.
  std::uniform_int_distribution<int> windows(1, 4);
  const int m = c.merge;
  const std::vector<VisionGrid> grids = {{1, m * windows(rng), m * windows(rng)},
                                         {2, m * windows(rng), m * windows(rng)},
                                         {1, m * (windows(rng) + 3), m * windows(rng)},
                                         {1, m, m}};
  const VisionBlockWeights w = testing::random_vision_block(c.hidden, c.heads, 2 * c.hidden, rng);
  const VisionLayout layout = vision_layout(grids, m);
  std::vector<float> x(static_cast<size_t>(layout.num_patches() * c.hidden));
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (float& v : x) v = unit(rng);
  const std::vector<double> want = testing::reference_vision_block(w, x, grids, m, 10000.0);

  AttentionBackendOptions options;
  options.page_size = c.page_size;
  auto backend = make_attention_backend("cpu", options);
  AttentionLayer layer;
  layer.num_q_heads = layer.num_kv_heads = c.heads;
  layer.head_dim = c.hidden / c.heads;
  VisionAttention attention(*backend, layer, DType::f32, c.kv_dtype, Device::cpu(), c.page_size);
  vision_block_forward(w, x, layout, vision_rope_tables(layout, layer.head_dim), attention);
  EXPECT_LE(testing::relative_max_error(x, want), c.tolerance) << layout.num_patches() << " patches";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuVision,
                         ::testing::Values(VisionParam{320, 4, 2, 1, DType::f32, 5e-6},   // Qwen2-VL's head_dim 80
                                           VisionParam{256, 4, 1, 16, DType::f32, 5e-6},
                                           VisionParam{256, 2, 2, 16, DType::bf16, 5e-3}),
                         [](const auto& info) {
                           const VisionParam& p = info.param;
                           return "d" + std::to_string(p.hidden / p.heads) + "_merge" + std::to_string(p.merge) + "_page" +
                                  std::to_string(p.page_size) + "_" + std::string(dtype_name(p.kv_dtype));
                         });

TEST(VisionLayout, WindowsComeInRasterOrderAndEachFrameIsASequence) {
  // A 2 x 4 frame in 2 x 2 windows: the left window's four patches, then the right window's.
  const std::vector<VisionGrid> grids = {{2, 2, 4}};
  const VisionLayout layout = vision_layout(grids, 2);
  EXPECT_EQ(layout.cu_seqlens, (std::vector<int32_t>{0, 8, 16}));
  const std::vector<int32_t> rows = {0, 0, 1, 1, 0, 0, 1, 1}, cols = {0, 1, 0, 1, 2, 3, 2, 3};
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(std::vector<int32_t>(layout.row.begin() + 8 * t, layout.row.begin() + 8 * t + 8), rows);
    EXPECT_EQ(std::vector<int32_t>(layout.col.begin() + 8 * t, layout.col.begin() + 8 * t + 8), cols);
  }
}

TEST(VisionAttentionWindows, AnEmptyWindowChangesNothing) {
  // Qwen2.5-VL's windowed layers can hand cu_seqlens with empty windows: they are skipped, and the
  // other windows attend exactly as without them.
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int n = 10, heads = 2, d = 64;
  std::vector<float> q(static_cast<size_t>(n * heads * d)), k(q.size()), v(q.size());
  for (auto* t : {&q, &k, &v}) {
    for (float& x : *t) x = unit(rng);
  }
  auto backend = make_attention_backend("cpu", {});
  AttentionLayer layer;
  layer.num_q_heads = layer.num_kv_heads = heads;
  layer.head_dim = d;
  VisionAttention attention(*backend, layer, DType::f32, DType::f32, Device::cpu(), 1);
  auto run = [&](const std::vector<int32_t>& cu) {
    std::vector<float> out(q.size(), 0.0f);
    attention.forward(TensorView(q.data(), DType::f32, {n, heads, d}), TensorView(k.data(), DType::f32, {n, heads, d}),
                      TensorView(v.data(), DType::f32, {n, heads, d}), TensorView(out.data(), DType::f32, {n, heads, d}),
                      cu);
    return out;
  };
  const std::vector<float> plain = run({0, 4, 10});
  EXPECT_EQ(run({0, 4, 4, 10, 10}), plain);
  // And the windows are separate: one window over everything gives another result.
  EXPECT_NE(run({0, 10}), plain);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(VisionErrors, BadGridsHeadDimsAndSeqlensAreRefusedWithTheValue) {
  const std::vector<VisionGrid> odd = {{1, 4, 4}, {1, 3, 4}};
  EXPECT_NE(error_of([&] { vision_layout(odd, 2); }).find("vision grid 1 is (t=1, h=3, w=4); h and w must be multiples of "
                                                          "spatial_merge_size 2"),
            std::string::npos);
  const std::vector<VisionGrid> empty = {{0, 2, 2}};
  EXPECT_NE(error_of([&] { vision_layout(empty, 1); }).find("every size must be >= 1"), std::string::npos);
  const std::vector<VisionGrid> one = {{1, 2, 2}};
  EXPECT_NE(error_of([&] { vision_rope_tables(vision_layout(one, 1), 66); }).find("vision head_dim 66"),
            std::string::npos);
  const std::vector<int32_t> backwards = {0, 5, 3, 8};
  EXPECT_NE(error_of([&] { check_cu_seqlens(backwards, 8); }).find("cu_seqlens[2] = 3 is below cu_seqlens[1] = 5"),
            std::string::npos);
  const std::vector<int32_t> short_end = {0, 4};
  EXPECT_NE(error_of([&] { check_cu_seqlens(short_end, 8); }).find("ends at 4 but there are 8 patches"),
            std::string::npos);

  auto backend = make_attention_backend("cpu", {});
  AttentionLayer layer;
  layer.num_q_heads = layer.num_kv_heads = 2;
  layer.head_dim = 48;
  EXPECT_NE(error_of([&] { VisionAttention(*backend, layer, DType::f32, DType::f32, Device::cpu(), 1); })
                .find("head_dim 48 is not supported"),
            std::string::npos);
}

}  // namespace
}  // namespace specula
