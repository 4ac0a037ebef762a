// Structured output through the Engine on the shipped model (CPU): sampled generations for every
// schema of the corpus (two seeds each) are valid JSON documents of their schema by a real
// validator (ajv), every format's greedy output is a sentence (or, cut by the length limit, a live
// prefix) of its grammar, and bad formats are refused when the request is submitted, before any
// decoding.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/ajv_validator.h"
#include "grammar/grammar_fixtures.h"
#include "runtime/engine_fixtures.h"
#include "specula/core/error.h"
#include "specula/grammar/output_format.h"
#include "specula/runtime/engine.h"

namespace specula {
namespace {

using grammar::OutputFormat;
using testing_fixtures::kModel;
using testing_fixtures::kTexts;

EngineOptions options() {
  EngineOptions o;
  o.background_thread = false;
  o.runner.max_context_len = 640;
  o.runner.max_running_requests = 16;
  return o;
}

OutputFormat format(OutputFormat::Kind kind, std::string source = "") {
  OutputFormat f;
  f.kind = kind;
  f.source = std::move(source);
  grammar::compile(f);
  return f;
}

// Whether text is a sentence of the automaton (finished) or a prefix it can still extend (cut).
void expect_fits(const grammar::Automaton& a, const RequestOutput& out, const std::string& what) {
  grammar::MatchState st = a.start();
  for (char c : out.text) st = a.advance(st, static_cast<uint8_t>(c));
  EXPECT_FALSE(st.dead()) << what << ": " << out.text;
  if (out.finish_reason == "stop") {
    EXPECT_TRUE(a.can_end(st)) << what << ": " << out.text;
  }
}

TEST(StructuredOutput, SampledDocumentsOfCorpusSchemasValidateWithAjv) {
  ASSERT_TRUE(grammar::testing::ajv_installed()) << "ajv is missing: run scripts/setup.sh";
  const auto schemas = grammar::testing::schema_corpus();
  Engine engine(kModel, options());
  struct Run {
    int schema;
    std::shared_ptr<RequestHandle> handle;
    std::shared_ptr<const grammar::Automaton> automaton;
  };
  std::vector<Run> runs;
  const uint64_t seed = std::random_device{}();
  for (size_t i = 0; i < schemas.size(); ++i) {
    for (int s = 0; s < 2; ++s) {
      EngineRequest r;
      r.prompt = "Answer in JSON: " + schemas[i]["name"].get<std::string>() + "\n";
      r.max_new_tokens = 400;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = seed + static_cast<uint64_t>(runs.size());
      r.format = format(OutputFormat::Kind::kJsonSchema, schemas[i]["schema"].dump());
      const auto automaton = r.format.automaton;
      runs.push_back({static_cast<int>(i), engine.submit(std::move(r)), automaton});
    }
  }
  engine.run_until_idle();
  std::vector<std::pair<int, std::string>> finished;
  for (const Run& run : runs) {
    const RequestOutput out = run.handle->wait();
    const std::string name = schemas[static_cast<size_t>(run.schema)]["name"].get<std::string>();
    ASSERT_TRUE(out.finish_reason == "stop" || out.finish_reason == "length")
        << name << ": " << out.finish_reason << " after " << nlohmann::json(out.text).dump() << " ids " << nlohmann::json(out.output_ids).dump();
    expect_fits(*run.automaton, out, name + " (seed " + std::to_string(seed) + ")");
    if (out.finish_reason == "stop") finished.emplace_back(run.schema, out.text);
  }
  // The shipped model wanders (long strings, whitespace); most documents still finish.
  EXPECT_GE(finished.size() * 2, runs.size());
  const auto [status, report] = grammar::testing::validate_with_ajv(finished);
  EXPECT_EQ(status, 0) << report;
  EXPECT_NE(report.find("checked " + std::to_string(finished.size()) + " documents"), std::string::npos) << report;
}

TEST(StructuredOutput, EveryFormatsOutputFitsItsGrammar) {
  Engine engine(kModel, options());
  const std::vector<OutputFormat> formats = {
      format(OutputFormat::Kind::kJsonObject),
      format(OutputFormat::Kind::kRegex, "(the|a) [a-z]{2,8}( [a-z]{1,8}){1,4}\\."),
      format(OutputFormat::Kind::kGrammar,
             "root ::= expr \"=\" [0-9]+\nexpr ::= term ( [-+] term )*\nterm ::= [0-9]{1,3} | \"(\" expr \")\"\n"),
      format(OutputFormat::Kind::kJsonSchema, R"({"type":"array","items":{"enum":["red","green","blue"]},"maxItems":5})"),
  };
  for (const OutputFormat& f : formats) {
    for (float temperature : {0.0f, 0.7f}) {
      std::vector<std::shared_ptr<RequestHandle>> handles;
      for (size_t t = 0; t < 4; ++t) {
        EngineRequest r;
        r.prompt = kTexts[t];
        r.max_new_tokens = 120;
        r.sampling.temperature = temperature;
        r.sampling.seed = t;
        r.format = f;
        handles.push_back(engine.submit(std::move(r)));
      }
      engine.run_until_idle();
      for (auto& h : handles) {
        const RequestOutput out = h->wait();
        ASSERT_TRUE(out.finish_reason == "stop" || out.finish_reason == "length")
            << grammar::kind_name(f.kind) << ": " << out.finish_reason << " after " << nlohmann::json(out.text).dump() << " ids " << nlohmann::json(out.output_ids).dump();
        expect_fits(*f.automaton, out, std::string(grammar::kind_name(f.kind)));
      }
    }
  }
}

// A grammar that compiles but whose next-token mask exceeds the matcher's limit of simultaneous
// parses (after "z", 300 optional "q"s): the step's greedy requests take their mask-constrained
// argmax together, and that grammar's error ends its own request alone, greedy and sampled; the
// requests batched with it run to their length.
TEST(StructuredOutput, AGrammarThatHitsALimitEndsOnlyItsOwnRequest) {
  std::string text = "root ::= \"a\" [a-z]{1,5} | \"z\" t\nt ::=";
  for (int i = 0; i < 300; ++i) text += " \"q\"?";
  text += " \"w\"\n";
  OutputFormat bad;
  bad.kind = OutputFormat::Kind::kGrammar;
  bad.source = text;
  grammar::compile(bad);
  for (const float temperature : {0.0f, 0.8f}) {
    Engine engine(kModel, options());
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (size_t k = 0; k < 4; ++k) {
      EngineRequest r;
      r.prompt = kTexts[k];
      r.max_new_tokens = 12;
      r.ignore_eos = true;
      r.sampling.temperature = temperature;
      r.sampling.seed = k;
      if (k == 1) r.format = bad;
      if (k == 2) r.format = grammar::OutputFormat{OutputFormat::Kind::kRegex, "[a-z ]{20,40}", nullptr};
      if (k == 2) grammar::compile(r.format);
      handles.push_back(engine.submit(std::move(r)));
    }
    engine.run_until_idle();
    for (size_t k = 0; k < handles.size(); ++k) {
      const RequestOutput out = handles[k]->wait();
      if (k == 1) {
        EXPECT_NE(out.finish_reason.find("error: grammar: more than 256 simultaneous parses"), std::string::npos)
            << out.finish_reason;
      } else {
        EXPECT_EQ(out.finish_reason, "length") << "request " << k << " at temperature " << temperature;
        EXPECT_EQ(out.output_ids.size(), 12u);
      }
    }
  }
}

// Through the Engine: with the grammar vocabulary built on a thread while the model loads (the
// default) and without (the first constrained request builds it), the same requests decode the
// same tokens, greedy and sampled. How the scheduler takes the build: scheduler_test's
// Scheduler.TheFirstConstrainedRequestTakesTheVocabularyBeingBuilt.
TEST(StructuredOutput, TheVocabularyBuiltAtStartUpMasksAsTheOneBuiltOnFirstUse) {
  const OutputFormat f =
      format(OutputFormat::Kind::kJsonSchema, R"({"type":"object","properties":{"n":{"type":"integer"},)"
                                              R"("w":{"type":"string","maxLength":12}},"required":["n","w"]})");
  const uint64_t seed = std::random_device{}();
  const auto run = [&](bool prepare) {
    EngineOptions o = options();
    o.scheduler.prepare_grammar_vocabulary = prepare;
    Engine engine(kModel, o);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (size_t t = 0; t < 4; ++t) {
      EngineRequest r;
      r.prompt = kTexts[t];
      r.max_new_tokens = 60;
      r.sampling.temperature = t % 2 == 0 ? 0.0f : 0.8f;
      r.sampling.seed = seed + t;
      r.format = f;
      handles.push_back(engine.submit(std::move(r)));
    }
    engine.run_until_idle();
    std::vector<std::vector<int32_t>> ids;
    for (auto& h : handles) {
      const RequestOutput out = h->wait();
      EXPECT_TRUE(out.finish_reason == "stop" || out.finish_reason == "length") << out.finish_reason;
      expect_fits(*f.automaton, out, "seed " + std::to_string(seed));
      ids.push_back(out.output_ids);
    }
    return ids;
  };
  const auto built_at_start = run(true);
  EXPECT_EQ(built_at_start, run(false)) << "seed " << seed;
  for (const auto& ids : built_at_start) EXPECT_FALSE(ids.empty());
}

TEST(StructuredOutput, BadFormatsAreRefusedAtSubmit) {
  Engine engine(kModel, options());
  const auto refusal = [&](OutputFormat::Kind kind, const std::string& source) -> std::string {
    EngineRequest r;
    r.prompt = "x";
    r.format.kind = kind;
    r.format.source = source;
    try {
      engine.submit(std::move(r));
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(refusal(OutputFormat::Kind::kJsonSchema, R"({"type":"string","not":{}})").find("'not' is not supported"),
            std::string::npos);
  EXPECT_NE(refusal(OutputFormat::Kind::kRegex, "a(?=b)").find("regex: position"), std::string::npos);
  EXPECT_NE(refusal(OutputFormat::Kind::kGrammar, "root ::= item\n").find("'item' is used but never defined"),
            std::string::npos);
  EXPECT_NE(refusal(OutputFormat::Kind::kGrammar, "root ::= root \"a\" | \"b\"\n").find("left-recursive"),
            std::string::npos);
  // Nothing was queued: the engine is idle.
  EXPECT_FALSE(engine.step());
}

}  // namespace
}  // namespace specula
