// Bad input to the CPU backend gives one clear error naming the value and what is allowed.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "attention/attention_harness.h"
#include "specula/attention/cpu/cpu_backend.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"

namespace specula::testing {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CpuAttentionErrors, UnsupportedLayersAreRejectedAtCheck) {
  CpuAttentionBackend backend(AttentionBackendOptions{});
  AttentionLayer layer;
  layer.num_q_heads = 8;
  layer.num_kv_heads = 2;
  layer.head_dim = 72;
  EXPECT_NE(error_of([&] { backend.check_layer(layer, DType::bf16, DType::bf16); })
                .find("head_dim 72 is not supported; supported: 64, 80, 96, 128, 256"),
            std::string::npos);
  layer.head_dim = 64;
  layer.num_kv_heads = 3;
  EXPECT_NE(error_of([&] { backend.check_layer(layer, DType::bf16, DType::bf16); }).find("num_q_heads 8"), std::string::npos);
  layer.num_kv_heads = 2;
  EXPECT_NE(error_of([&] { backend.check_layer(layer, DType::i32, DType::bf16); }).find("query dtype i32"), std::string::npos);
  EXPECT_NE(error_of([&] { backend.check_layer(layer, DType::bf16, DType::fp8_e5m2); }).find("KV cache dtype fp8_e5m2"),
            std::string::npos);
  layer.sinks = {1.0f, 2.0f};
  EXPECT_NE(error_of([&] { backend.check_layer(layer, DType::bf16, DType::bf16); }).find("sinks has 2 entries"), std::string::npos);
  layer.sinks.clear();
  layer.use_local_attention = true;
  EXPECT_NE(error_of([&] { backend.check_layer(layer, DType::bf16, DType::bf16); }).find("attention_chunk_size"), std::string::npos);
}

TEST(CpuAttentionErrors, BadOptions) {
  AttentionBackendOptions o;
  o.page_size = 24;
  EXPECT_NE(error_of([&] { CpuAttentionBackend b(o); }).find("page_size 24"), std::string::npos);
  o.page_size = 16;
  o.attention_chunk_size = 40;
  EXPECT_NE(error_of([&] { CpuAttentionBackend b(o); }).find("attention_chunk_size 40"), std::string::npos);
}

TEST(CpuAttentionErrors, ShapeMismatchAndOutOfRangeIndices) {
  HarnessConfig c;
  c.requests = {{10, 4}};
  AttentionHarness h(c, 5);
  CpuAttentionBackend backend(h.backend_options());
  h.run(backend);  // sanity: the well-formed batch runs

  ReqToTokenPool req_pool(2, 32);
  MHAKVPool kv_pool(KVPoolConfig{64, 1, 2, 64, 64, DType::f32, Device::cpu()});
  ForwardBatch b;
  b.forward_mode = ForwardMode::DECODE;
  b.batch_size = 1;
  b.req_pool_indices = {5};  // out of range
  b.seq_lens = {3};
  b.out_cache_loc = {9};
  b.req_to_token_pool = &req_pool;
  b.token_to_kv_pool = &kv_pool;
  EXPECT_NE(error_of([&] { backend.init_forward_metadata(b); }).find("req_pool_index 5"), std::string::npos);
  b.req_pool_indices = {1};
  req_pool.write(1, 0, std::vector<int32_t>{1, 2, 900});  // token slot beyond the pool
  EXPECT_NE(error_of([&] { backend.init_forward_metadata(b); }).find("outside the KV pool"), std::string::npos);
  req_pool.write(1, 0, std::vector<int32_t>{1, 2, 3});
  backend.init_forward_metadata(b);
  AttentionLayer layer;
  layer.num_q_heads = 4;
  layer.num_kv_heads = 2;
  layer.head_dim = 64;
  Buffer q(DType::f32, {1, 4, 64}), k(DType::f32, {1, 2, 64}), v(DType::f32, {1, 2, 64});
  Buffer wrong_out(DType::f32, {1, 4, 32});
  EXPECT_NE(error_of([&] { backend.forward(q, k, v, wrong_out, layer, b); }).find("attention output has shape [1, 4, 32]"),
            std::string::npos);
  Buffer out(DType::f32, {1, 4, 64});
  b.out_cache_loc = {64};
  backend.init_forward_metadata(b);
  EXPECT_NE(error_of([&] { backend.forward(q, k, v, out, layer, b); }).find("cache location 64"), std::string::npos);
}

// Draft tree steps are a GPU operation (EAGLE's CUDA draft head): the CPU backend refuses them by name.
TEST(CpuAttentionErrors, DraftTreeIsRefusedNamingTheBackend) {
  CpuAttentionBackend backend(AttentionBackendOptions{});
  AttentionLayer layer;
  layer.num_q_heads = 4;
  layer.num_kv_heads = 2;
  layer.head_dim = 64;
  MHAKVPool kv_pool(KVPoolConfig{16, 1, 2, 64, 64, DType::f32, Device::cpu()});
  Buffer q(DType::f32, {2, 4, 64}), out(DType::f32, {2, 4, 64});
  const std::vector<int32_t> ints(4, 0);
  DraftTreeView tree;
  tree.prefix_pages = ints.data();
  tree.page_stride = 1;
  tree.prefix_lens = ints.data();
  tree.branch_slots = ints.data();
  tree.branch_stride = 1;
  tree.branch_len = 1;
  EXPECT_NE(error_of([&] { backend.forward_draft_tree(q, out, layer, kv_pool, tree); })
                .find("attention backend 'cpu' does not support forward_draft_tree"),
            std::string::npos);
}

}  // namespace
}  // namespace specula::testing
