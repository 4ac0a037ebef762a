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
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'flashinfer' is not known; known: cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hybrid"), std::string::npos) << msg;
  }
  o.speculative_attention_mode = "both";
  EXPECT_THROW(make_attention_backend("hybrid", o), Error);
  o.speculative_attention_mode = "prefill";
  o.page_size = 12;
  EXPECT_THROW(make_attention_backend("cpu", o), Error);
}

// Records which calls reach it.
class RecordingBackend final : public AttentionBackend {
 public:
  std::string_view name() const override { return "recording"; }
  void check_layer(const AttentionLayer&, DType, DType) const override { ++checks; }
  void init_forward_metadata(const ForwardBatch&) override { ++inits; }
  void forward_extend(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const AttentionLayer&,
                      const ForwardBatch&, const ForwardOptions&) override { ++extends; }
  void forward_decode(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const AttentionLayer&,
                      const ForwardBatch&, const ForwardOptions&) override { ++decodes; }
  mutable int checks = 0;
  int inits = 0, extends = 0, decodes = 0;
};

TEST(HybridBackend, RoutesEachModeToItsSide) {
  for (const char* spec_mode : {"prefill", "decode"}) {
    auto prefill_owner = std::make_unique<RecordingBackend>();
    auto decode_owner = std::make_unique<RecordingBackend>();
    RecordingBackend& prefill = *prefill_owner;
    RecordingBackend& decode = *decode_owner;
    HybridAttentionBackend hybrid(std::move(prefill_owner), std::move(decode_owner), spec_mode);
    const bool spec_on_decode = std::string_view(spec_mode) == "decode";
    hybrid.check_layer(AttentionLayer{}, DType::bf16, DType::bf16);
    EXPECT_EQ(prefill.checks, 1);
    EXPECT_EQ(decode.checks, 1);
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::MIXED, ForwardMode::DECODE, ForwardMode::TARGET_VERIFY,
                             ForwardMode::DRAFT_EXTEND}) {
      ForwardBatch batch;
      batch.forward_mode = mode;
      const int p0 = prefill.inits + prefill.extends + prefill.decodes;
      const int d0 = decode.inits + decode.extends + decode.decodes;
      hybrid.init_forward_metadata(batch);
      hybrid.forward({}, {}, {}, {}, AttentionLayer{}, batch);
      const bool to_decode = mode == ForwardMode::DECODE ||
                             (spec_on_decode && (mode == ForwardMode::TARGET_VERIFY || mode == ForwardMode::DRAFT_EXTEND));
      EXPECT_EQ(prefill.inits + prefill.extends + prefill.decodes - p0, to_decode ? 0 : 2) << forward_mode_name(mode);
      EXPECT_EQ(decode.inits + decode.extends + decode.decodes - d0, to_decode ? 2 : 0) << forward_mode_name(mode);
    }
    EXPECT_EQ(decode.decodes, 1);
    EXPECT_EQ(prefill.decodes, 0);
  }
}

TEST(HybridBackend, CpuHybridMatchesCpuAndHasNoGraphs) {
  AttentionBackendOptions o;
  auto hybrid = make_attention_backend("hybrid", o);
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = {{30, mode == ForwardMode::DECODE ? 1 : 9}, {4, mode == ForwardMode::DECODE ? 1 : 20}};
    AttentionHarness h(c, 99);
    auto direct = make_attention_backend("cpu", o);
    EXPECT_EQ(h.run(*hybrid).out, h.run(*direct).out);
  }
  EXPECT_THROW(hybrid->init_cuda_graph_state(8, 64), Error);
}

}  // namespace
}  // namespace specula::testing
