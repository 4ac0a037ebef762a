// The CPU backend against the naive float64 reference, one test per variant, on randomized
// shapes, lengths and page sizes with fresh random inputs each run (the seed is printed on
// failure). Every case runs with the kernel for this processor and with the portable one.
#include <gtest/gtest.h>

#include <random>

#include "attention/attention_harness.h"
#include "specula/attention/cpu/cpu_backend.h"

namespace specula::testing {
namespace {

double atol_for(DType out_dtype) { return out_dtype == DType::f32 ? 2e-5 : 1e-3; }

// Runs the harness on both kernels and checks each against the reference.
void check_against_reference(const HarnessConfig& config, const char* what) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << what << " seed=" << seed);
  AttentionHarness h(config, seed);
  const AttentionResult truth = h.reference<double>();
  const AttentionResult naive = h.reference<float>();
  for (CpuIsa isa : {best_cpu_isa(), CpuIsa::generic}) {
    SCOPED_TRACE(cpu_isa_name(isa));
    CpuAttentionBackend backend(h.backend_options());
    backend.set_isa(isa);
    expect_close_to_reference(h.run(backend), truth, naive, atol_for(config.q_dtype), what);
  }
}

// An e4m3 cache with per-layer scales: values ~N(0,1) become ~47, the middle of e4m3's range (not
// powers of two: x / scale and x * (1 / scale) differ).
void use_fp8_cache(HarnessConfig& c) {
  c.kv_dtype = DType::fp8_e4m3;
  c.k_scale = 0.0213f;
  c.v_scale = 0.37f;
}

std::mt19937 rng_for_shapes() { return std::mt19937(static_cast<uint32_t>(fresh_seed())); }

TEST(CpuAttention, ExtendWithPrefixMha) {
  auto rng = rng_for_shapes();
  HarnessConfig c;
  c.requests = random_requests(rng, 3, 70, 40, ForwardMode::EXTEND);
  c.num_q_heads = 4;
  c.num_kv_heads = 4;
  check_against_reference(c, "extend MHA");
}

TEST(CpuAttention, DecodeMha) {
  auto rng = rng_for_shapes();
  HarnessConfig c;
  c.mode = ForwardMode::DECODE;
  c.requests = random_requests(rng, 5, 300, 1, ForwardMode::DECODE);
  c.requests[0].prefix_len = 0;  // a one-token sequence
  c.num_q_heads = 4;
  c.num_kv_heads = 4;
  check_against_reference(c, "decode MHA");
}

TEST(CpuAttention, Gqa) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    for (auto [hq, hk] : {std::pair{8, 2}, std::pair{12, 4}, std::pair{32, 8}, std::pair{6, 2}}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 90, 20, mode);
      c.num_q_heads = hq;
      c.num_kv_heads = hk;
      c.page_size = 16;
      check_against_reference(c, "GQA");
    }
  }
}

TEST(CpuAttention, Mqa) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    for (int hq : {1, 8, 20, 40}) {  // 40 > 16 lanes: the group splits across work items
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 2, 60, 9, mode);
      c.num_q_heads = hq;
      c.num_kv_heads = 1;
      check_against_reference(c, "MQA");
    }
  }
}

TEST(CpuAttention, HeadDims) {
  auto rng = rng_for_shapes();
  for (int d : {64, 80, 96, 128, 256}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 2, 50, 20, mode);
      c.head_dim = d;
      c.num_q_heads = 4;
      c.num_kv_heads = 2;
      check_against_reference(c, "head_dim");
    }
  }
  HarnessConfig c;  // different K and V head dims
  c.requests = random_requests(rng, 2, 40, 10, ForwardMode::EXTEND);
  c.head_dim = 128;
  c.v_head_dim = 64;
  check_against_reference(c, "head_dim 128 / v_head_dim 64");
}

TEST(CpuAttention, PageSize) {
  auto rng = rng_for_shapes();
  for (int ps : {1, 2, 16, 64, 128}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 200, 70, mode);
      c.page_size = ps;
      check_against_reference(c, "page_size");
    }
  }
}

TEST(CpuAttention, NonCausal) {
  auto rng = rng_for_shapes();
  for (int ps : {1, 16}) {
    HarnessConfig c;
    c.requests = random_requests(rng, 4, 0, 90, ForwardMode::EXTEND);  // encoder: no prefix
    c.requests.push_back({33, 17});                                     // and one with a prefix
    c.causal = false;
    c.page_size = ps;
    check_against_reference(c, "non-causal varlen");
  }
}

TEST(CpuAttention, SlidingWindow) {
  auto rng = rng_for_shapes();
  for (int window : {0, 1, 7, 32, 100}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 150, 60, mode);
      c.window_left = window;
      c.page_size = window % 2 ? 16 : 1;
      check_against_reference(c, "sliding window");
    }
  }
}

TEST(CpuAttention, LocalAttention) {
  auto rng = rng_for_shapes();
  for (auto [chunk, ps] : {std::pair{4, 1}, std::pair{16, 16}, std::pair{32, 16}, std::pair{64, 64}, std::pair{8, 2}}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 130, 50, mode);
      c.requests.push_back({120, mode == ForwardMode::DECODE ? 1 : 70});  // longest: chunks smaller than it
      c.chunk_size = chunk;
      c.page_size = ps;
      check_against_reference(c, "local attention");
    }
  }
}

// Dual chunk attention through the shared harness (whose reference attends to the three parts
// apart): the CPU backend, which dual_chunk_test checks on its own reference too, agrees with it,
// so the CUDA tests may rely on the harness's reference.
TEST(CpuAttention, DualChunkPrefillAndDecode) {
  HarnessConfig c;
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.page_size = 4;
  c.dca_chunk_len = 32;
  c.dca_original_max = 40;
  c.mode = ForwardMode::EXTEND;
  c.requests = {{0, 100}, {70, 9}, {5, 3}};
  check_against_reference(c, "dual chunk extend");
  c.mode = ForwardMode::DECODE;
  c.requests = {{150, 1}, {40, 1}, {10, 1}, {64, 1}};
  check_against_reference(c, "dual chunk decode");
}

TEST(CpuAttention, SoftCap) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 3, 80, 30, mode);
    c.logit_cap = 1.5f;
    c.scaling = 0.4f;  // scores well beyond the cap, so capping changes the result
    check_against_reference(c, "soft-cap");
  }
}

TEST(CpuAttention, Sinks) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 3, 80, 30, mode);
    c.sinks = true;
    c.window_left = 16;  // gpt-oss pairs sinks with sliding windows
    check_against_reference(c, "sinks");
  }
}

TEST(CpuAttention, CustomScale) {
  auto rng = rng_for_shapes();
  HarnessConfig c;
  c.requests = random_requests(rng, 2, 40, 20, ForwardMode::EXTEND);
  c.scaling = 0.0371f;
  check_against_reference(c, "custom scale");
}

TEST(CpuAttention, TreeMask) {
  auto rng = rng_for_shapes();
  for (int draft : {1, 4, 8, 33}) {
    for (int ps : {1, 16}) {
      HarnessConfig c;
      c.mode = ForwardMode::TARGET_VERIFY;
      c.requests = random_requests(rng, 3, 90, 1, ForwardMode::DECODE);
      for (auto& r : c.requests) r.extend_len = draft;
      c.tree_mask = true;
      c.page_size = ps;
      check_against_reference(c, "tree mask");
    }
  }
}

TEST(CpuAttention, TargetVerifyChainIsCausal) {
  auto rng = rng_for_shapes();
  HarnessConfig c;
  c.mode = ForwardMode::TARGET_VERIFY;
  c.requests = random_requests(rng, 3, 90, 1, ForwardMode::DECODE);
  for (auto& r : c.requests) r.extend_len = 4;
  check_against_reference(c, "verify without a tree mask");
}

TEST(CpuAttention, MixedAndDraftExtendModes) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::MIXED, ForwardMode::DRAFT_EXTEND}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 4, 60, 20, ForwardMode::EXTEND);
    c.requests[1].extend_len = 1;  // a decoding request inside a mixed batch
    check_against_reference(c, forward_mode_name(mode).data());
  }
}

TEST(CpuAttention, Fp8Kv) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 3, 100, 30, mode);
    use_fp8_cache(c);
    c.q_dtype = DType::bf16;
    c.page_size = 16;
    check_against_reference(c, "fp8 KV");
  }
}

TEST(CpuAttention, Bf16AndF16) {
  auto rng = rng_for_shapes();
  for (DType d : {DType::bf16, DType::f16}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 100, 30, mode);
      c.kv_dtype = d;
      c.q_dtype = d;
      c.page_size = 16;
      check_against_reference(c, dtype_name(d).data());
    }
  }
}

// bf16 KV with f32 queries and outputs, one-token work items with every feature they can have:
// on a processor with AVX512-BF16 such items run the decode kernel (decode_kernel.h), whose scores
// are f32 dot products (the query split into three bf16 terms), so the f32 tolerance holds. Decode
// items are one token; so are extend items when a GQA group has more than 8 query heads (the
// planner then gives each item one token). Head dim 80 is not a multiple of 32 and takes the tile
// kernel; 40 query heads on one KV head split into items of 16, 16 and 8.
TEST(CpuAttention, Bf16KvOneTokenItemsEveryFeature) {
  auto rng = rng_for_shapes();
  struct Case {
    int hq, hk, d, page;
    int window;
    float cap;
    bool sinks, causal;
  };
  const Case cases[] = {{32, 8, 128, 16, -1, 0.0f, false, true}, {8, 2, 64, 1, -1, 0.0f, false, true},
                        {40, 1, 128, 16, -1, 0.0f, false, true}, {4, 4, 256, 16, -1, 0.0f, false, true},
                        {8, 2, 80, 16, -1, 0.0f, false, true},   {8, 2, 128, 16, 37, 0.0f, false, true},
                        {8, 2, 128, 1, -1, 20.0f, false, true},  {8, 2, 128, 16, -1, 0.0f, true, true},
                        {12, 4, 64, 16, -1, 0.0f, false, false}};
  const auto config = [&](const Case& k, ForwardMode mode) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = mode == ForwardMode::DECODE ? random_requests(rng, 4, 300, 1, mode) : random_requests(rng, 3, 120, 40, mode);
    c.num_q_heads = k.hq;
    c.num_kv_heads = k.hk;
    c.head_dim = k.d;
    c.page_size = k.page;
    c.kv_dtype = DType::bf16;
    c.window_left = k.window;
    c.logit_cap = k.cap;
    c.sinks = k.sinks;
    c.causal = k.causal;
    return c;
  };
  for (const Case& k : cases) check_against_reference(config(k, ForwardMode::DECODE), "bf16 KV decode");
  // The same with an e4m3 cache and its per-layer scales (K's folded into the query, V's into the
  // output, each e4m3 code turned into bf16 exactly).
  for (const Case& k : cases) {
    HarnessConfig c = config(k, ForwardMode::DECODE);
    use_fp8_cache(c);
    check_against_reference(c, "fp8 KV decode");
  }
  // Extend with groups of 10 and 16 query heads: causal one-token items at every position.
  for (const Case& k : {Case{20, 2, 128, 16, -1, 0.0f, false, true}, Case{16, 1, 64, 1, 29, 15.0f, true, true}}) {
    check_against_reference(config(k, ForwardMode::EXTEND), "bf16 KV extend");
  }
}

// Decode rows that see more than 4096 keys run in chunks of 2048 keys merged by their
// log-sum-exp (decode_split.h) where the decode kernel serves them: against the float64 reference
// with windows that leave a long row more or fewer than 4096 visible keys, soft-cap, sinks and
// non-causal rows; rows just at and past the threshold; and a long row batched with others gives
// the bits it gives alone.
TEST(CpuAttention, LongDecodeRowsSplitOverKeys) {
  struct Case {
    int hq, hk, d, page;
    int window;
    float cap;
    bool sinks, causal;
  };
  const Case cases[] = {{32, 8, 128, 16, -1, 0.0f, false, true}, {8, 8, 64, 1, -1, 0.0f, true, true},
                        {8, 2, 128, 16, 5000, 0.0f, false, true}, {8, 2, 128, 16, 3000, 0.0f, true, true},
                        {8, 2, 128, 64, -1, 25.0f, true, true},   {8, 2, 128, 16, -1, 0.0f, false, false}};
  for (const Case& k : cases) {
    HarnessConfig c;
    c.mode = ForwardMode::DECODE;
    c.requests = {{9000, 1}, {4096, 1}, {4095, 1}, {2500, 1}, {6143, 1}};
    c.num_q_heads = k.hq;
    c.num_kv_heads = k.hk;
    c.head_dim = k.d;
    c.page_size = k.page;
    c.kv_dtype = DType::bf16;
    c.window_left = k.window;
    c.logit_cap = k.cap;
    c.sinks = k.sinks;
    c.causal = k.causal;
    check_against_reference(c, "long bf16 KV decode");
    use_fp8_cache(c);
    check_against_reference(c, "long fp8 KV decode");
  }
  HarnessConfig c;
  c.mode = ForwardMode::DECODE;
  c.requests = {{300, 1}, {8300, 1}, {5000, 1}};
  c.kv_dtype = DType::bf16;
  AttentionHarness h(c, fresh_seed());
  CpuAttentionBackend backend(h.backend_options());
  const AttentionResult batched = h.run(backend);
  const size_t row = static_cast<size_t>(c.num_q_heads) * c.head_dim;
  for (int r = 0; r < 3; ++r) {
    const AttentionResult alone = h.run(backend, {r});
    for (size_t i = 0; i < row; ++i) ASSERT_EQ(alone.out[i], batched.out[static_cast<size_t>(r) * row + i]) << "request " << r;
    for (int hq = 0; hq < c.num_q_heads; ++hq) {
      ASSERT_EQ(alone.lse[static_cast<size_t>(hq)], batched.lse[static_cast<size_t>(r * c.num_q_heads + hq)]) << "request " << r;
    }
  }
}

TEST(CpuAttention, RowsThatSeeNothingGiveZeroAndMinusInfLse) {
  // A tree mask whose first draft row is all zero: that query sees no key at all.
  for (bool sinks : {false, true}) {
    HarnessConfig c;
    c.mode = ForwardMode::TARGET_VERIFY;
    c.requests = {{0, 3}, {21, 3}};
    c.tree_mask = true;
    c.hide_first_draft_row = true;
    c.sinks = sinks;
    check_against_reference(c, sinks ? "empty rows with sinks" : "empty rows");
    AttentionHarness h(c, fresh_seed());
    CpuAttentionBackend backend(h.backend_options());
    const AttentionResult got = h.run(backend);
    for (int hq = 0; hq < c.num_q_heads; ++hq) {
      EXPECT_EQ(std::isinf(got.lse[static_cast<size_t>(hq)]), !sinks);  // token 0 of request 0
      EXPECT_EQ(got.out[static_cast<size_t>(hq * c.head_dim)], 0.0);
    }
  }
}

TEST(CpuAttention, BatchedEqualsPerRequest) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 5, 120, 40, mode);
    c.page_size = 16;
    c.q_dtype = DType::bf16;
    c.kv_dtype = DType::bf16;
    AttentionHarness h(c, fresh_seed());
    CpuAttentionBackend backend(h.backend_options());
    const AttentionResult batched = h.run(backend);
    const int hq = c.num_q_heads, dv = c.head_dim;
    size_t offset = 0;
    for (int r = 0; r < static_cast<int>(c.requests.size()); ++r) {
      const AttentionResult alone = h.run(backend, {r});
      for (size_t i = 0; i < alone.out.size(); ++i) {
        ASSERT_EQ(alone.out[i], batched.out[offset + i]) << "request " << r << " element " << i;
      }
      offset += static_cast<size_t>(c.requests[static_cast<size_t>(r)].extend_len) * hq * dv;
    }
  }
}

}  // namespace
}  // namespace specula::testing
