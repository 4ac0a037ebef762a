// Regular expressions as grammars (grammar/regex.h): the same random patterns (literals with
// multi-byte letters, classes with ranges and escapes, \d \w \s, groups of every kind,
// alternation, greedy and lazy quantifiers, anchors at the ends) compiled by the translator and
// by std::regex (ECMAScript) must accept the same strings; the refusals name the position and
// what is supported.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/grammar/matcher.h"
#include "specula/grammar/regex.h"
#include "grammar/grammar_fixtures.h"

namespace specula::grammar {
namespace {

using testing::accepts;

std::shared_ptr<const Automaton> compile(const std::string& pattern) {
  return std::make_shared<const Automaton>(std::make_shared<const Grammar>(compile_regex(pattern)));
}

const std::vector<std::string> kLetters = {"a", "b", "7", " ", "_", "-", "\xC3\xA9", "\xE2\x82\xAC"};

// A random pattern whose meaning on these letters is the same over bytes (std::regex) and code
// points (the translator): multi-byte letters only as grouped literals, classes over ASCII.
// Quantifiers do not nest: libstdc++'s std::regex backtracks exponentially on nested ones.
std::string random_pattern(std::mt19937& rng, int depth, bool quantified = false) {
  auto sub = [&] { return random_pattern(rng, depth - 1, quantified); };
  auto sub_q = [&] { return random_pattern(rng, depth - 1, true); };
  int kind = depth <= 0 ? static_cast<int>(rng() % 4) : static_cast<int>(rng() % 10);
  if (quantified && (kind == 6 || kind == 7)) kind = 4;
  switch (kind) {
    case 0: {
      const std::string& l = kLetters[rng() % kLetters.size()];
      return l.size() > 1 ? "(?:" + l + ")" : (l == "-" ? "\\-" : l);
    }
    case 1: return std::vector<std::string>{"\\d", "\\w", "\\s", "[a-b7]", "[\\d_]", "[^ab\\x80-\\u{10FFFF}]", "[ \\-]"}[rng() % 7];
    case 2: return "(" + sub() + ")";
    case 3: return "(?<g" + std::to_string(rng() % 9) + ">" + sub() + ")";
    case 4: return "(?:" + sub() + sub() + ")";
    case 5: return "(?:" + sub() + "|" + sub() + ")";
    case 6: return "(?:" + sub_q() + ")" + std::vector<std::string>{"*", "+", "?", "*?", "+?", "??"}[rng() % 6];
    case 7: {
      const int m = static_cast<int>(rng() % 3), n = m + static_cast<int>(rng() % 3);
      const std::string q = rng() % 3 == 0 ? "{" + std::to_string(m) + ",}" : (rng() % 2 ? "{" + std::to_string(m) + "}" : "{" + std::to_string(m) + "," + std::to_string(n) + "}");
      return "(?:" + sub_q() + ")" + q + (rng() % 4 == 0 ? "?" : "");
    }
    default: return sub() + sub();
  }
}

TEST(RegexGrammar, AcceptsWhatStdRegexAccepts) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  int positives = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string pattern = random_pattern(rng, 4);
    if (rng() % 4 == 0) pattern = "^" + pattern + "$";
    SCOPED_TRACE("pattern " + pattern + ", seed " + std::to_string(seed));
    const auto a = compile(pattern);
    std::string std_pattern = pattern;
    // std::regex has no \u{...}: the same range spelled with the bytes of UTF-8 lead bytes.
    for (size_t at; (at = std_pattern.find("\\x80-\\u{10FFFF}")) != std::string::npos;) std_pattern.replace(at, 15, "\\x80-\\xff");
    for (size_t at; (at = std_pattern.find("(?<g")) != std::string::npos;) std_pattern.replace(at, 6, "(");
    const std::regex re(std_pattern, std::regex::ECMAScript);
    for (int i = 0; i < 40; ++i) {
      const std::string t = i % 2 ? testing::random_text(kLetters, rng, 5) : testing::random_sentence(*a, kLetters, rng, 10);
      const bool want = std::regex_match(t, re);
      ASSERT_EQ(accepts(*a, t), want) << "text '" << t << "'";
      positives += want;
    }
  }
  EXPECT_GT(positives, 1000);
}

TEST(RegexGrammar, EscapesAndClasses) {
  const auto a = compile("\\u00e9\\x41\\u{1F600}[\\s\\-]\\.\\d{2}[^\\d\\n]+.");
  EXPECT_TRUE(accepts(*a, "\xC3\xA9" "A\xF0\x9F\x98\x80-.42xy\xE2\x82\xACz"));
  EXPECT_TRUE(accepts(*a, "\xC3\xA9" "A\xF0\x9F\x98\x80\xE3\x80\x80.42__\xC3\xA9"));  // U+3000 is \s
  EXPECT_FALSE(accepts(*a, "\xC3\xA9" "A\xF0\x9F\x98\x80-.42x\n"));                  // . excludes \n
  EXPECT_FALSE(accepts(*a, "\xC3\xA9" "A\xF0\x9F\x98\x80-.4x2y"));
}

std::string error_of(const std::string& pattern) {
  return testing::error_text([](const std::string& p) { compile_regex(p); }, pattern);
}

TEST(RegexGrammar, RefusesWhatItDoesNotSupport) {
  EXPECT_NE(error_of("(a)\\1").find("position 3: backreferences are not supported"), std::string::npos);
  EXPECT_NE(error_of("a(?=b)").find("position 1: lookahead"), std::string::npos);
  EXPECT_NE(error_of("a(?<!b)").find("lookahead, lookbehind"), std::string::npos);
  EXPECT_NE(error_of("\\bword").find("word boundaries"), std::string::npos);
  EXPECT_NE(error_of("a^b").find("anchors are supported only at the start"), std::string::npos);
  EXPECT_NE(error_of("*a").find("nothing to repeat before '*'"), std::string::npos);
  EXPECT_NE(error_of("a**").find("a quantifier cannot follow a quantifier"), std::string::npos);
  EXPECT_NE(error_of("(ab").find("unclosed '('"), std::string::npos);
  EXPECT_NE(error_of("ab)").find("unmatched ')'"), std::string::npos);
  EXPECT_NE(error_of("a{x}").find("'{' must start a quantifier"), std::string::npos);
  EXPECT_NE(error_of("[z-a]").find("reversed"), std::string::npos);
  EXPECT_NE(error_of("\\p{L}").find("escape '\\p' is not supported"), std::string::npos);
  EXPECT_NE(error_of("\\ud800").find("U+D800 is not a code point"), std::string::npos);
  EXPECT_NE(error_of("a{2000}").find("exceeds the limit 1000"), std::string::npos);
  EXPECT_EQ(error_of("^(?:a|b)*?c{1,3}?$"), "(no error)");
}

}  // namespace
}  // namespace specula::grammar
