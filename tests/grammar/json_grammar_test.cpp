// The free-form JSON grammar (json_grammar.h) against an independent JSON parser (nlohmann::json):
// random documents it serialises are sentences; random sentences walked out of the automaton parse
// as JSON objects; malformed text is refused.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "specula/grammar/json_grammar.h"
#include "specula/grammar/matcher.h"
#include "grammar/grammar_fixtures.h"

namespace specula::grammar {
namespace {

std::shared_ptr<const Automaton> json_automaton() {
  static const auto a = std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_object_grammar()));
  return a;
}

bool accepts(const std::string& s) { return testing::accepts(*json_automaton(), s); }

nlohmann::json random_value(std::mt19937& rng, int depth) {
  const int kind = depth <= 0 ? 2 + static_cast<int>(rng() % 5) : static_cast<int>(rng() % 7);
  switch (kind) {
    case 0: {
      nlohmann::json o = nlohmann::json::object();
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) o["k" + std::to_string(rng() % 100) + (rng() % 3 ? "" : "\xC3\xA9\n\"")] = random_value(rng, depth - 1);
      return o;
    }
    case 1: {
      nlohmann::json a = nlohmann::json::array();
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) a.push_back(random_value(rng, depth - 1));
      return a;
    }
    case 2: return static_cast<int64_t>(rng() % 2000) - 1000;
    case 3: return std::ldexp(static_cast<double>(static_cast<int>(rng() % 20000) - 10000), static_cast<int>(rng() % 80) - 40);
    case 4: {
      std::string s;
      const int n = static_cast<int>(rng() % 6);
      for (int i = 0; i < n; ++i) s += std::vector<std::string>{"a", "\"", "\\", "\t", "\x01", "\xE2\x82\xAC", "/", " "}[rng() % 8];
      return s;
    }
    case 5: return rng() % 2 == 0;
    default: return nullptr;
  }
}

TEST(JsonGrammar, AcceptsSerialisedDocuments) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < 300; ++i) {
    nlohmann::json doc = nlohmann::json::object();
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) doc["f" + std::to_string(k)] = random_value(rng, 3);
    // Compact, pretty-printed, and with space around.
    for (const std::string& text : {doc.dump(), doc.dump(2), doc.dump(1, '\t'), " " + doc.dump() + "\n"}) {
      ASSERT_TRUE(accepts(text)) << text << " (seed " << seed << ")";
    }
  }
}

TEST(JsonGrammar, SentencesOfTheAutomatonAreJsonObjects) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const Automaton& a = *json_automaton();
  const std::string alphabet = "{}[]\":,0123456789-.eE+truefalsn \\/bu\n\xC3\xA9";
  int ended = 0;
  for (int walk = 0; walk < 400; ++walk) {
    MatchState st = a.start();
    std::string text;
    for (int step = 0; step < 120; ++step) {
      if (a.can_end(st) && rng() % 2 == 0) break;
      std::vector<std::pair<char, MatchState>> options;
      for (char c : alphabet) {
        MatchState t = a.advance(st, static_cast<uint8_t>(c));
        if (!t.dead()) options.emplace_back(c, std::move(t));
      }
      if (options.empty()) {
        // Only a finished document may have nothing more to take (its trailing whitespace spent).
        ASSERT_TRUE(a.can_end(st)) << "a live prefix with no continuation: " << text;
        break;
      }
      auto& pick = options[rng() % options.size()];
      text += pick.first;
      st = std::move(pick.second);
    }
    if (!a.can_end(st)) continue;
    ++ended;
    // JSON syntax, and an object at the top. The reference refuses numbers past the double range,
    // which are JSON all the same: every digit of an exponent is zeroed first (a change of equal
    // length that keeps strings and their \u escapes valid).
    std::string checked = text;
    for (size_t i = 0; i + 1 < checked.size(); ++i) {
      if (checked[i] != 'e' && checked[i] != 'E') continue;
      size_t j = i + 1;
      if (checked[j] == '+' || checked[j] == '-') ++j;
      for (; j < checked.size() && std::isdigit(static_cast<unsigned char>(checked[j])); ++j) checked[j] = '0';
    }
    ASSERT_TRUE(nlohmann::json::accept(checked)) << text << " (seed " << seed << ")";
    EXPECT_EQ(text[text.find_first_not_of(" \t\r\n")], '{') << text;
  }
  EXPECT_GT(ended, 100);
}

TEST(JsonGrammar, RefusesMalformedText) {
  for (const std::string bad : {"{'a':1}", "{\"a\":01}", "{\"a\":1,}", "{\"a\":+1}", "{\"a\":1.}", "{\"a\":.5}",
                                "{\"a\x01\":1}", "{\"a\":\"\\x\"}", "{\"a\":tru}", "{\"a\":[1,]}", "{\"a\" 1}", "{}{}",
                                "{\"a\":\"\\u12G4\"}", "{\"a\":\"\\uD800\"}", "{\"a\":\"\\udc00\\ud800\"}"}) {
    EXPECT_FALSE(accepts(bad)) << bad;
    EXPECT_FALSE(nlohmann::json::accept(bad)) << bad;  // the reference agrees these are not JSON
  }
  // Valid JSON that the grammar refuses on purpose: a top-level array, and whitespace past its
  // bounds (more than kMaxJsonSpace spaces in a row, two line breaks in a row).
  EXPECT_FALSE(accepts("[1, 2]"));
  EXPECT_FALSE(accepts("{     }"));
  EXPECT_TRUE(accepts("{    }"));
  EXPECT_FALSE(accepts("{\n\n}"));
  EXPECT_TRUE(accepts("{\r\n" + std::string(40, ' ') + "}"));
  EXPECT_FALSE(accepts("{\n" + std::string(41, ' ') + "}"));
}

}  // namespace
}  // namespace specula::grammar
