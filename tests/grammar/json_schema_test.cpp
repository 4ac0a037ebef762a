// JSON Schema to grammar (grammar/json_schema.h): documents walked out of each schema's automaton
// are validated by a real validator (ajv 2020 with ajv-formats, run by Node from
// tests/grammar/js, installed by scripts/setup.sh) over a corpus of 50 real-world-shaped schemas;
// integer bounds against plain arithmetic; refusals name the keyword and where it is.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "grammar/ajv_validator.h"
#include "grammar/grammar_fixtures.h"
#include "specula/core/error.h"
#include "specula/grammar/json_grammar.h"
#include "specula/grammar/json_schema.h"
#include "specula/grammar/token_masker.h"
#include "specula/grammar/matcher.h"
#include "specula/grammar/sentence.h"

namespace specula::grammar {
namespace {

using testing::accepts;
using testing::ajv_installed;
using testing::schema_corpus;
using testing::validate_with_ajv;

std::shared_ptr<const Automaton> schema_automaton(const std::string& schema) {
  return std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_schema_grammar(schema)));
}

std::string refusal(const std::string& schema) {
  return testing::error_text([](const std::string& s) { json_schema_to_gbnf(s); }, schema);
}

TEST(JsonSchema, DocumentsOfFiftyRealWorldSchemasValidateWithAjv) {
  ASSERT_TRUE(ajv_installed()) << "ajv is missing: run scripts/setup.sh (npm ci in tests/grammar/js)";
  const auto schemas = schema_corpus();
  ASSERT_GE(schemas.size(), 50u);
  std::mt19937 rng(std::random_device{}());
  std::vector<std::pair<int, std::string>> documents;
  for (size_t i = 0; i < schemas.size(); ++i) {
    const std::string name = schemas[i]["name"].get<std::string>();
    std::shared_ptr<const Automaton> a;
    try {
      a = schema_automaton(schemas[i]["schema"].dump());
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    for (int d = 0; d < 20; ++d) {
      const std::string doc = random_sentence(*a, rng, 20 + static_cast<int>(rng() % 200));
      ASSERT_TRUE(accepts(*a, doc)) << name << ": " << doc;
      ASSERT_TRUE(nlohmann::json::accept(doc)) << name << ": not JSON: " << nlohmann::json(doc).dump();
      documents.emplace_back(static_cast<int>(i), doc);
    }
  }
  const auto [status, output] = validate_with_ajv(documents);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find(fmt::format("checked {} documents", documents.size())), std::string::npos) << output;
}

TEST(JsonSchema, AjvRejectsWhatTheSchemaRefuses) {
  // The validator run itself can fail: a document the schema does not allow is reported.
  const auto [status, output] = validate_with_ajv({{0, "{}"}, {0, "not json"}});
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("FAIL"), std::string::npos) << output;
}

TEST(JsonSchema, IntegerBoundsAreExact) {
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 40; ++round) {
    const int lo = static_cast<int>(rng() % 4000) - 2000;
    const int hi = lo + static_cast<int>(rng() % 3000);
    const int kind = static_cast<int>(rng() % 4);
    nlohmann::json s = {{"type", "integer"}};
    std::function<bool(long)> inside;
    if (kind == 0) {
      s["minimum"] = lo, s["maximum"] = hi;
      inside = [=](long x) { return x >= lo && x <= hi; };
    } else if (kind == 1) {
      s["exclusiveMinimum"] = lo, s["exclusiveMaximum"] = hi;
      inside = [=](long x) { return x > lo && x < hi; };
    } else if (kind == 2) {
      s["minimum"] = lo;
      inside = [=](long x) { return x >= lo; };
    } else {
      s["maximum"] = hi;
      inside = [=](long x) { return x <= hi; };
    }
    if (kind == 1 && hi - lo < 2) continue;
    const auto a = schema_automaton(s.dump());
    for (long x = lo - 1200; x <= hi + 1200; x += 1 + static_cast<long>(rng() % 7)) {
      EXPECT_EQ(accepts(*a, std::to_string(x)), inside(x)) << s.dump() << " at " << x;
    }
    for (long x : {100000L, -100000L, 12345678L}) EXPECT_EQ(accepts(*a, std::to_string(x)), inside(x)) << s.dump() << " at " << x;
    EXPECT_FALSE(accepts(*a, "007")) << s.dump();
    EXPECT_FALSE(accepts(*a, "1.5")) << s.dump();
  }
}

TEST(JsonSchema, ObjectsKeepDeclaredOrderAndRequiredKeys) {
  // Declared order, which is not alphabetical here.
  const auto a = schema_automaton(R"({"type":"object","properties":{"c":{"type":"integer"},"b":{"type":"string"},
    "a":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(accepts(*a, R"({"b":"x"})"));
  EXPECT_TRUE(accepts(*a, R"({"c":1,"b":"x","a":true})"));
  EXPECT_TRUE(accepts(*a, "{\n  \"c\": 1,\n  \"b\": \"x\"\n}"));
  EXPECT_FALSE(accepts(*a, R"({"c":1})"));          // b is required
  EXPECT_FALSE(accepts(*a, R"({"b":"x","c":1})"));  // declared order
  EXPECT_FALSE(accepts(*a, R"({"b":"x","d":1})"));  // no additional keys
  // Additional keys of a schema, never one of the declared names.
  const auto open = schema_automaton(R"({"type":"object","properties":{"id":{"type":"integer"}},
    "additionalProperties":{"type":"string"}})");
  EXPECT_TRUE(accepts(*open, R"({"id":1,"name":"x","i":"y","idx":"z"})"));
  EXPECT_TRUE(accepts(*open, R"({"name":"x"})"));
  EXPECT_FALSE(accepts(*open, R"({"id":1,"id":"x"})"));
  EXPECT_FALSE(accepts(*open, R"({"id":1,"name":2})"));
}

TEST(JsonSchema, ArraysRespectPrefixItemsAndCounts) {
  const auto a = schema_automaton(R"({"type":"array","prefixItems":[{"type":"number"},{"type":"string"}],
    "items":{"type":"boolean"},"minItems":1,"maxItems":4})");
  EXPECT_TRUE(accepts(*a, "[1]"));
  EXPECT_TRUE(accepts(*a, R"([1,"a",true,false])"));
  EXPECT_FALSE(accepts(*a, "[]"));
  EXPECT_FALSE(accepts(*a, R"([1,"a",true,false,true])"));
  EXPECT_FALSE(accepts(*a, R"(["a"])"));
  const auto tuple = schema_automaton(R"({"type":"array","prefixItems":[{"const":1},{"const":2},{"const":3}],
    "items":false,"maxItems":2})");
  EXPECT_TRUE(accepts(*tuple, "[1,2]"));
  EXPECT_FALSE(accepts(*tuple, "[1,2,3]"));
}

TEST(JsonSchema, RefusalsNameTheKeywordAndWhereItIs) {
  EXPECT_NE(refusal(R"({"type":"object","properties":{"x":{"not":{"type":"null"}}}})").find("'/properties/x'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","properties":{"x":{"not":{"type":"null"}}}})").find("'not' is not supported"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","uniqueItems":true})").find("'uniqueItems'"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"#/$defs/missing"})").find("names nothing"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"https://example.com/s.json"})").find("is not supported"), std::string::npos);
  EXPECT_NE(refusal("false").find("accepts nothing"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","minLength":5,"maxLength":2})").find("minLength is above maxLength"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"integer","minimum":5,"maximum":2})").find("no integer"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"number","maximum":2.5})").find("minimum: 0"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","pattern":"a\"b"})").find("U+0022 is not allowed"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","format":"hostname"})").find("format 'hostname'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"objekt"})").find("unknown type 'objekt'"), std::string::npos);
  EXPECT_NE(refusal("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","required":["a"]})").find("'a' is required but not among"), std::string::npos);
  // allOf: a part beside its $ref, and additionalProperties false that would forbid another part's
  // properties (JSON Schema applies it per schema object).
  EXPECT_NE(refusal(R"({"$defs":{"B":{"type":"object","properties":{"id":{"type":"integer"}}}},
    "allOf":[{"$ref":"#/$defs/B","required":["id"]}]})").find("'required' beside $ref"), std::string::npos);
  EXPECT_NE(refusal(R"({"allOf":[{"type":"object","properties":{"a":{}},"additionalProperties":false},
    {"type":"object","properties":{"b":{}}}]})").find("forbids 'b'"), std::string::npos);
  // Counts beyond the grammar's repetition limit name the schema keyword.
  EXPECT_NE(refusal(R"({"type":"string","maxLength":5000})").find("maxLength must be an integer in [0, 1000]"),
            std::string::npos);
}

TEST(JsonSchema, NamesOfDefsAndKeysNeverClash) {
  // A $defs entry named like a shared rule.
  const auto a = schema_automaton(R"({"$defs":{"json_value":{"type":"string"}},"type":"object",
    "properties":{"a":{"$ref":"#/$defs/json_value"},"b":{}},"required":["a","b"]})");
  EXPECT_TRUE(accepts(*a, R"({"a":"x","b":[1,{"c":null}]})"));
  EXPECT_FALSE(accepts(*a, R"({"a":1,"b":2})"));
  // Declared names that need escapes leave the other keys' grammar valid JSON.
  const auto b = schema_automaton(R"({"type":"object","properties":{"a\"b":{"type":"integer"},"c":{"type":"integer"}},
    "additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(accepts(*b, R"({"a\"b":1,"c":2,"d":3})"));
  EXPECT_FALSE(accepts(*b, R"({"a"":1})"));
  EXPECT_FALSE(accepts(*b, R"({"c":1,"c":2})"));
}

// Every byte, then JSON-ish pieces of 1-6 letters with multi-byte code points split anywhere, then
// a special token (empty).
std::shared_ptr<const Vocabulary> random_vocabulary(std::mt19937& rng) {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  const std::string alphabet = "{}[]\":, \n\t0123456789.-eEtrufalsnxyz\\\xC3\xA9\xE4\xB8\x96";
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int j = 0; j < n; ++j) t += alphabet[rng() % alphabet.size()];
    vocab.push_back(t);
  }
  vocab.emplace_back();
  return std::make_shared<const Vocabulary>(vocab);
}

// `walks` random generations of `a` of at most `steps` tokens: visit gets each state and the trie
// walk's mask of it, then a token that mask allows is taken (a walk may stop where the grammar
// can end).
void random_walks(const std::shared_ptr<const Automaton>& a, const Vocabulary& vocabulary, std::mt19937& rng,
                  int walks, int steps,
                  const std::function<void(const MatchState&, const std::vector<uint32_t>&)>& visit) {
  for (int walk = 0; walk < walks; ++walk) {
    GrammarMatcher m(a);
    for (int step = 0; step < steps; ++step) {
      std::vector<uint32_t> walked;
      vocabulary.trie.fill_mask(*a, m.state(), walked);
      visit(m.state(), walked);
      std::vector<int> ok;
      for (size_t id = 0; id < vocabulary.tokens.size(); ++id) {
        if ((walked[id / 32] >> (id % 32)) & 1u) ok.push_back(static_cast<int>(id));
      }
      if (ok.empty() || (m.can_end() && rng() % 8 == 0)) break;
      ASSERT_TRUE(m.accept_token(vocabulary.tokens[static_cast<size_t>(ok[rng() % ok.size()])]));
    }
  }
}

// The masker's cached split (accepted in any context / checked against the stack) gives exactly
// the trie walk's mask, which grammar_test checks token by token, on states of real generations.
TEST(TokenMasker, MasksEqualTheTrieWalk) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto vocabulary = random_vocabulary(rng);
  const auto corpus = schema_corpus();
  std::vector<std::shared_ptr<const Automaton>> automata = {
      std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_object_grammar())),
      schema_automaton(corpus[3]["schema"].dump()), schema_automaton(corpus[17]["schema"].dump()),
      schema_automaton(corpus[30]["schema"].dump()), schema_automaton(corpus[44]["schema"].dump())};
  int compared = 0;
  for (const auto& a : automata) {
    TokenMasker masker(a, vocabulary);
    random_walks(a, *vocabulary, rng, 6, 80, [&](const MatchState& state, const std::vector<uint32_t>& walked) {
      std::vector<uint32_t> cached;
      masker.fill(state, cached);
      ASSERT_EQ(cached, walked) << "state " << compared;
      ++compared;
    });
    EXPECT_GT(masker.cached_tops(), 3u);
  }
  EXPECT_GT(compared, 500);
}

// Rows of one grammar share its masker and the scheduler fills a step's rows on several threads:
// eight threads filling the states of random generations through one cold masker, each in its own
// order, get the trie walk's mask for every state.
TEST(TokenMasker, ThreadsSharingAMaskerGetTheTrieWalksMasks) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto vocabulary = random_vocabulary(rng);
  const auto corpus = schema_corpus();
  for (int which : {5, 21, 38}) {
    const auto a = schema_automaton(corpus[static_cast<size_t>(which)]["schema"].dump());
    std::vector<MatchState> states;
    std::vector<std::vector<uint32_t>> want;
    random_walks(a, *vocabulary, rng, 8, 60, [&](const MatchState& state, const std::vector<uint32_t>& walked) {
      states.push_back(state);
      want.push_back(walked);
    });
    TokenMasker masker(a, vocabulary);
    std::vector<std::string> failures(8);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::vector<size_t> order(states.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), std::mt19937(seed + static_cast<unsigned>(t)));
        std::vector<uint32_t> got;
        for (size_t i : order) {
          masker.fill(states[i], got);
          if (got != want[i] && failures[static_cast<size_t>(t)].empty()) {
            failures[static_cast<size_t>(t)] = "state " + std::to_string(i);
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int t = 0; t < 8; ++t) EXPECT_EQ(failures[static_cast<size_t>(t)], "") << "schema " << which << " thread " << t;
    EXPECT_GT(states.size(), 40u);
    EXPECT_GT(masker.cached_tops(), 3u);
  }
}

}  // namespace
}  // namespace specula::grammar
