// The registry and the Hybrid composite: names resolve, unknown names list the known ones, and
// Hybrid routes each mode to the right side (and matches running that side directly).
#include <gtest/gtest.h>

#include "attention/attention_harness.h"
#include "specula/attention/hybrid_backend.h"
#include "specula/core/error.h"

namespace specula::testing {
namespace {

TEST(AttentionRegistry, MakesCpuAndListsNames) {
  AttentionBackendOptions o;
  EXPECT_EQ(make_attention_backend("cpu", o)->name(), "cpu");
  EXPECT_EQ(make_attention_backend("hybrid", o)->name(), "hybrid");
  try {
    make_attention_backend("flashinfer", o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'flashinfer' is not known; known: cpu, hybrid"), std::string::npos) << e.what();
  }
  o.speculative_attention_mode = "both";
  EXPECT_THROW(make_attention_backend("hybrid", o), Error);
  o.speculative_attention_mode = "prefill";
  o.page_size = 12;
  EXPECT_THROW(make_attention_backend("cpu", o), Error);
}

TEST(HybridBackend, RoutesByModeAndMatchesTheSideItPicks) {
  AttentionBackendOptions o;
  auto hybrid_ptr = make_attention_backend("hybrid", o);
  auto& hybrid = dynamic_cast<HybridAttentionBackend&>(*hybrid_ptr);
  EXPECT_EQ(&hybrid.select(ForwardMode::DECODE), &hybrid.decode_backend());
  EXPECT_EQ(&hybrid.select(ForwardMode::EXTEND), &hybrid.prefill_backend());
  EXPECT_EQ(&hybrid.select(ForwardMode::MIXED), &hybrid.prefill_backend());
  EXPECT_EQ(&hybrid.select(ForwardMode::TARGET_VERIFY), &hybrid.prefill_backend());
  o.speculative_attention_mode = "decode";
  auto spec_on_decode = make_attention_backend("hybrid", o);
  auto& h2 = dynamic_cast<HybridAttentionBackend&>(*spec_on_decode);
  EXPECT_EQ(&h2.select(ForwardMode::TARGET_VERIFY), &h2.decode_backend());
  EXPECT_EQ(&h2.select(ForwardMode::DRAFT_EXTEND), &h2.decode_backend());

  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = {{30, mode == ForwardMode::DECODE ? 1 : 9}, {4, mode == ForwardMode::DECODE ? 1 : 20}};
    AttentionHarness h(c, 99);
    auto direct = make_attention_backend("cpu", o);
    const auto a = h.run(hybrid);
    const auto b = h.run(*direct);
    EXPECT_EQ(a.out, b.out);
    EXPECT_THROW(hybrid.init_cuda_graph_state(8, 64), Error);  // neither side has graphs
  }
}

}  // namespace
}  // namespace specula::testing
