// Structured output under speculative decoding on a GPU: the verify's per-node masks, the CUDA
// graphs of the draft loop and of the verify, and the plain decode's constrained sampling together
// keep greedy output with EAGLE and EAGLE-3 (chains and trees) equal to the GPU target's own
// constrained greedy output, for every kind of format and every schema of the corpus
// (deterministic mode, so that a token's logits do not depend on its batch). Skipped where no GPU
// is visible.
#include <gtest/gtest.h>


#include "speculative/spec_fixtures.h"
#include "speculative/spec_grammar_fixtures.h"

namespace specula {
namespace {

using grammar::OutputFormat;

EngineOptions gpu_options(int page_size) {
  EngineOptions o;
  o.background_thread = false;
  o.runner.device = Device::cuda(0);
  o.runner.page_size = page_size;
  o.runner.max_context_len = 400;
  o.runner.max_running_requests = 16;
  o.runner.deterministic = true;
  o.scheduler.log_retractions = false;
  return o;
}

void expect_speculation_keeps_output(const std::vector<std::pair<std::string, OutputFormat>>& fs, size_t prompts,
                                     int max_new) {
  const auto plain = spec_grammar::outputs(gpu_options(16), std::nullopt, fs, nullptr, false, prompts, max_new);
  // Requests that ask for logprobs download their logits and pick on the host (Sampler::greedy_at);
  // the others take the device's masked argmax: both pick the same tokens.
  const auto on_host = spec_grammar::outputs(gpu_options(16), std::nullopt, fs, nullptr, false, prompts, max_new, 0);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(on_host[i], plain[i]) << "format " << fs[i / prompts].first << ", prompt " << i % prompts << ": "
                                    << spec_grammar::first_difference(on_host[i], plain[i]);
  }
  struct Shape {
    EagleKind kind;
    SpecParams params;
    int page_size;
  };
  for (const Shape& s : {Shape{EagleKind::EAGLE3, {3, 1, 4}, 16}, Shape{EagleKind::EAGLE3, {4, 4, 10}, 1},
                         Shape{EagleKind::EAGLE, {3, 1, 4}, 1}, Shape{EagleKind::EAGLE, {4, 4, 10}, 16}}) {
    const EagleOptions spec{s.kind, spec_fixtures::head_dir(s.kind), s.params, SpecPolicyKind::FIXED};
    const auto got = spec_grammar::outputs(gpu_options(s.page_size), spec, fs, nullptr, false, prompts, max_new);
    ASSERT_EQ(got.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(got[i], plain[i]) << eagle_kind_name(s.kind) << " (" << s.params.num_steps << ", " << s.params.topk
                                  << ", " << s.params.num_draft_tokens << ") page " << s.page_size << ", format "
                                  << fs[i / prompts].first << ", prompt " << i % prompts << ": "
                                  << spec_grammar::first_difference(got[i], plain[i]);
    }
  }
}

TEST(CudaSpecGrammar, GreedyOutputEqualsTheOutputWithoutSpeculation) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_speculation_keeps_output(spec_grammar::formats(), 2, 160);
}

TEST(CudaSpecGrammar, EveryCorpusSchemaKeepsThePlainGreedyOutput) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto fs = spec_grammar::corpus_formats();
  ASSERT_GE(fs.size(), 50u);
  expect_speculation_keeps_output(fs, 1, 96);
}

}  // namespace
}  // namespace specula
