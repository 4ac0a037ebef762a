// The Qwen2-VL vision block with its attention on the GPU (the CUDA backend's non-causal varlen
// extend over a scratch KV pool) against the float64 reference; images of different sizes and a
// video in one batch.
#include <gtest/gtest.h>

#include <random>

#include "specula/core/device.h"
#include "vision_reference.h"

namespace specula {
namespace {

struct CudaVisionParam {
  int hidden, heads, merge, page_size;
  DType kv_dtype;
  double tolerance;
};

class CudaVision : public ::testing::TestWithParam<CudaVisionParam> {};

TEST_P(CudaVision, BlockMatchesFloat64Reference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const CudaVisionParam c = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> windows(1, 6);
  const int m = c.merge;
  // One image long enough for several key tiles of the prefill kernel.
  const std::vector<VisionGrid> grids = {{1, m * windows(rng), m * windows(rng)},
                                         {2, m * windows(rng), m * windows(rng)},
                                         {1, m * (windows(rng) + 10), m * (windows(rng) + 6)},
                                         {1, m, m}};
  const VisionBlockWeights w = testing::random_vision_block(c.hidden, c.heads, 2 * c.hidden, rng);
  const VisionLayout layout = vision_layout(grids, m);
  std::vector<float> x(static_cast<size_t>(layout.num_patches() * c.hidden));
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (float& v : x) v = unit(rng);
  const std::vector<double> want = testing::reference_vision_block(w, x, grids, m, 10000.0);

  AttentionBackendOptions options;
  options.device = Device::cuda();
  options.page_size = c.page_size;
  options.max_context_len = 8192;
  auto backend = make_attention_backend("cuda", options);
  AttentionLayer layer;
  layer.num_q_heads = layer.num_kv_heads = c.heads;
  layer.head_dim = c.hidden / c.heads;
  VisionAttention attention(*backend, layer, DType::bf16, c.kv_dtype, Device::cuda(), c.page_size);
  vision_block_forward(w, x, layout, vision_rope_tables(layout, layer.head_dim), attention);
  EXPECT_LE(testing::relative_max_error(x, want), c.tolerance) << layout.num_patches() << " patches";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaVision,
                         ::testing::Values(CudaVisionParam{320, 4, 2, 1, DType::bf16, 1e-2},  // head_dim 80
                                           CudaVisionParam{512, 4, 2, 16, DType::bf16, 1e-2},  // the wgmma kernel
                                           CudaVisionParam{256, 4, 1, 64, DType::bf16, 1e-2}),
                         [](const auto& info) {
                           const CudaVisionParam& p = info.param;
                           return "d" + std::to_string(p.hidden / p.heads) + "_merge" + std::to_string(p.merge) +
                                  "_page" + std::to_string(p.page_size);
                         });

}  // namespace
}  // namespace specula
