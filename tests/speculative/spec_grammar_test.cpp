// Structured output under speculative decoding (CPU, the shipped pair): the verify masks each tree
// node by its own path, so greedy output with EAGLE and EAGLE-3, chains and trees, equals the
// output without speculation for every kind of format (JSON object, JSON schemas of the corpus, a
// regular expression, a GBNF grammar), end-of-sequence included.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "speculative/spec_fixtures.h"
#include "speculative/spec_grammar_fixtures.h"

namespace specula {
namespace {

using grammar::OutputFormat;
using spec_grammar::compiled;
using spec_grammar::formats;

EngineOptions options(int page_size) {
  EngineOptions o;
  o.background_thread = false;
  o.runner.page_size = page_size;
  o.runner.max_context_len = 400;
  o.runner.max_running_requests = 8;
  return o;
}

// Greedy outputs on the CPU with this page size (the fixture's outputs()).
std::vector<std::vector<int32_t>> outputs(const std::optional<EagleOptions>& spec, int page_size,
                                          const std::vector<std::pair<std::string, OutputFormat>>& fs,
                                          std::vector<std::string>* reasons = nullptr, bool ignore_eos = false,
                                          size_t prompts = 2, int max_new = 160) {
  return spec_grammar::outputs(options(page_size), spec, fs, reasons, ignore_eos, prompts, max_new);
}

TEST(SpecGrammar, GreedyOutputEqualsTheOutputWithoutSpeculation) {
  const auto fs = formats();
  std::vector<std::string> reasons;
  const auto plain = outputs(std::nullopt, 16, fs, &reasons);
  // Some outputs end because the grammar finished (end-of-sequence where it may end, or nothing
  // more allowed), so that path is compared too.
  EXPECT_GT(std::count(reasons.begin(), reasons.end(), "stop"), 2);
  for (const spec_grammar::SpecShape& s : spec_grammar::spec_shapes()) {
    const EagleOptions spec{s.kind, spec_fixtures::head_dir(s.kind), s.params, SpecPolicyKind::FIXED};
    const auto got = outputs(spec, s.page_size, fs);
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(got[i], plain[i]) << s.name() << ", format " << fs[i / 2].first << ", prompt " << i % 2;
    }
  }
}

// Without end-of-sequence tokens a grammar that finishes mid-tree leaves nodes below it where
// nothing fits; the request stops at the finishing token, and its batch-mates go on.
TEST(SpecGrammar, GrammarsThatFinishInsideTheTreeStopTheirRequestOnly) {
  const std::vector<std::pair<std::string, OutputFormat>> fs = {
      {"short words", compiled(OutputFormat::Kind::kRegex, "[a-z]{2,4}( [a-z]{2,4}){0,2}")},
      {"digits", compiled(OutputFormat::Kind::kGrammar, "root ::= [0-9] [0-9]\n")},
      {"text", compiled(OutputFormat::Kind::kRegex, "[^\\n]{20,40}")},
  };
  std::vector<std::string> reasons;
  const auto plain = outputs(std::nullopt, 16, fs, &reasons, /*ignore_eos=*/true);
  for (const std::string& r : reasons) EXPECT_EQ(r, "stop");
  for (const EagleKind kind : {EagleKind::EAGLE3, EagleKind::EAGLE}) {
    const EagleOptions spec{kind, spec_fixtures::head_dir(kind), SpecParams{4, 4, 10}, SpecPolicyKind::FIXED};
    std::vector<std::string> spec_reasons;
    const auto got = outputs(spec, 16, fs, &spec_reasons, /*ignore_eos=*/true);
    EXPECT_EQ(spec_reasons, reasons);
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(got[i], plain[i]) << fs[i / 2].first << ", prompt " << i % 2;
  }
}

// Every schema of the corpus, one prompt each, chains and trees of both heads.
TEST(SpecGrammar, EveryCorpusSchemaKeepsThePlainGreedyOutput) {
  const auto fs = spec_grammar::corpus_formats();
  ASSERT_GE(fs.size(), 50u);
  const auto plain = outputs(std::nullopt, 16, fs, nullptr, false, 1, 96);
  for (const spec_grammar::SpecShape& s : spec_grammar::spec_shapes()) {
    const EagleOptions spec{s.kind, spec_fixtures::head_dir(s.kind), s.params, SpecPolicyKind::FIXED};
    const auto got = outputs(spec, s.page_size, fs, nullptr, false, 1, 96);
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(got[i], plain[i]) << s.name() << ", schema " << fs[i].first;
  }
}

}  // namespace
}  // namespace specula
