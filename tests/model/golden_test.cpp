// The shipped model against the golden fixtures written by tools/export/golden.py from the
// PyTorch model (float32 compute from the bf16 weights): logits at several positions and the
// 64-token greedy continuation of every prompt.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "specula/runtime/generator.h"

namespace specula {
namespace {

const std::filesystem::path kSource = SPECULA_SOURCE_DIR;

nlohmann::json load_fixture() {
  std::ifstream in(kSource / "tests/data/model_pair/target.json");
  return nlohmann::json::parse(in);
}

TEST(ShippedModel, LogitsMatchPyTorch) {
  Generator gen(kSource / "models/specula-byte-6m", GeneratorOptions{});
  const nlohmann::json fixture = load_fixture();
  const int vocab = gen.config().vocab_size;
  for (const auto& p : fixture["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(p["prompt"].get<std::string>());
    ASSERT_EQ(gen.tokenizer().encode(p["prompt"].get<std::string>()), ids);
    const std::vector<float> logits = gen.prompt_logits(ids);
    for (const auto& at : p["logits_at"]) {
      const int pos = at["position"].get<int>();
      const float* row = logits.data() + static_cast<size_t>(pos) * vocab;
      const auto top_ids = at["top_ids"].get<std::vector<int>>();
      const auto top_logits = at["top_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < top_ids.size(); ++i) {
        EXPECT_NEAR(row[top_ids[i]], top_logits[i], 2e-3) << "position " << pos << " rank " << i;
      }
      double sum = 0, sum_sq = 0;
      for (int v = 0; v < vocab; ++v) {
        sum += row[v];
        sum_sq += static_cast<double>(row[v]) * row[v];
      }
      EXPECT_NEAR(sum, at["sum"].get<double>(), 0.05) << "position " << pos;
      EXPECT_NEAR(sum_sq, at["sum_sq"].get<double>(), 0.5) << "position " << pos;
    }
    const auto last = p["last_logits"].get<std::vector<double>>();
    const float* row = logits.data() + (ids.size() - 1) * static_cast<size_t>(vocab);
    for (int v = 0; v < vocab; ++v) ASSERT_NEAR(row[v], last[static_cast<size_t>(v)], 2e-3) << "token " << v;
  }
}

TEST(ShippedModel, GreedyContinuationIsIdentical) {
  Generator gen(kSource / "models/specula-byte-6m", GeneratorOptions{});
  const nlohmann::json fixture = load_fixture();
  for (const auto& p : fixture["prompts"]) {
    GenerateRequest r;
    r.prompt_ids = p["ids"].get<std::vector<int32_t>>();
    r.max_new_tokens = 64;
    r.ignore_eos = true;
    const GenerateResult result = gen.generate(r);
    EXPECT_EQ(result.output_ids, p["greedy_ids"].get<std::vector<int32_t>>()) << p["prompt"].get<std::string>();
    EXPECT_EQ(gen.tokenizer().decode(result.output_ids), p["greedy_text"].get<std::string>());
  }
}

TEST(ShippedModel, PagedBf16CacheKeepsGreedyTokens) {
  // A bf16 cache with 64-token pages: the same greedy tokens wherever the fixture's top-2 margin
  // is comfortable (the first 24 steps of every prompt have margins > 0.1).
  GeneratorOptions o;
  o.page_size = 64;
  o.kv_dtype = DType::bf16;
  Generator gen(kSource / "models/specula-byte-6m", o);
  const nlohmann::json fixture = load_fixture();
  for (const auto& p : fixture["prompts"]) {
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
    size_t safe = 0;
    while (safe < margins.size() && margins[safe] > 0.1) ++safe;
    GenerateRequest r;
    r.prompt_ids = p["ids"].get<std::vector<int32_t>>();
    r.max_new_tokens = static_cast<int>(safe);
    r.ignore_eos = true;
    const GenerateResult result = gen.generate(r);
    ASSERT_EQ(result.output_ids.size(), safe);
    for (size_t i = 0; i < safe; ++i) ASSERT_EQ(result.output_ids[i], expected[i]) << "step " << i;
  }
}

TEST(ShippedModel, StopsAtEosAndFreesItsCache) {
  GeneratorOptions small;
  small.max_context_len = 128;  // the KV pool holds one 128-token context
  Generator gen(kSource / "models/specula-byte-6m", small);
  // Repeated generations that fill the context would exhaust the pool if anything leaked.
  for (int i = 0; i < 3; ++i) {
    GenerateRequest r;
    r.prompt_ids = gen.tokenizer().encode("Hello");
    r.max_new_tokens = 500;  // capped by the context: 128 - 6 prompt tokens
    r.ignore_eos = true;
    EXPECT_EQ(gen.generate(r).output_ids.size(), 122u);
  }
  GenerateRequest r;
  r.prompt_ids = gen.tokenizer().encode("A");
  r.max_new_tokens = 5;
  GenerateRequest first;
  first.prompt_ids = r.prompt_ids;
  first.max_new_tokens = 1;
  r.stop_token_ids = {gen.generate(first).output_ids[0]};
  const GenerateResult stopped = gen.generate(r);
  EXPECT_EQ(stopped.output_ids.size(), 1u);
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.text, "") << "a stop token's text is not part of the output";
  GenerateRequest too_long;
  too_long.prompt_ids.assign(128, 65);
  EXPECT_THROW(gen.generate(too_long), Error);
}

TEST(ShippedModel, StopStringsCutTheTextAndStreamNothingPastThem) {
  Generator gen(kSource / "models/specula-byte-6m", GeneratorOptions{});
  // The reference continuation of the first prompt is " is to be a single statement of the
  // statement.  The\nquick brown "; "statement." first appears at its second "statement".
  GenerateRequest r;
  r.prompt_ids = gen.tokenizer().encode("The quick brown fox");
  r.max_new_tokens = 64;
  r.stop_strings = {"statement.", "never appears"};
  std::string streamed;
  const GenerateResult result = gen.generate(r, [&](std::string_view t) { streamed += t; });
  EXPECT_EQ(result.text, " is to be a single statement of the ");
  EXPECT_EQ(streamed, result.text);
  EXPECT_EQ(result.finish_reason, "stop");
  EXPECT_EQ(gen.tokenizer().decode(result.output_ids), " is to be a single statement of the statement.");
}

}  // namespace
}  // namespace specula
