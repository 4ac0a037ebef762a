// The grammar engine (src/specula/grammar): GBNF parsing and its refusals; the automaton against
// an independent reference (std::regex, ECMAScript, on random regular languages with multi-byte
// UTF-8 literals); rollback against replaying the prefix; token masks against feeding every
// vocabulary token on its own (brute force). Random inputs; the seed is printed.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/grammar/grammar.h"
#include "specula/grammar/matcher.h"
#include "specula/grammar/token_mask.h"
#include "grammar/grammar_fixtures.h"

namespace specula::grammar {
namespace {

using testing::accepts;

std::shared_ptr<const Automaton> compile(const std::string& text) {
  return std::make_shared<const Automaton>(std::make_shared<const Grammar>(Grammar::parse(text)));
}

std::string error_of(const std::string& text) {
  return testing::error_text([](const std::string& t) { Grammar::parse(t); }, text);
}

TEST(Grammar, ParsesGbnfAndMatchesSentences) {
  const auto a = compile(R"(
    root   ::= object
    object ::= "{" ws ( pair ( "," ws pair )* )? "}"
    pair   ::= [a-z]+ ":" ws value   # keys are lower-case words
    value  ::= "null" | [0-9]{1,3} | object | "\"" [^"\\\x00-\x1f]* "\""
    ws     ::= [ \t\n]*
  )");
  for (const std::string s : {"{}", "{ a:null}", "{ab:12,\n  cd:{ x:\"h\xC3\xA9llo\"}}", "{a:123}"}) {
    EXPECT_TRUE(accepts(*a, s)) << s;
  }
  for (const std::string s : {"{", "{a:1234}", "{A:null}", "{a:null,}", "{a:\"\x01\"}", "{}}", ""}) {
    EXPECT_FALSE(accepts(*a, s)) << s;
  }
  GrammarMatcher m(a);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_token("{a:"));
  EXPECT_FALSE(m.accept_token("}"));  // refused, and nothing changed
  EXPECT_TRUE(m.accept_token("nu"));
  EXPECT_TRUE(m.accept_token("ll}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.terminated());
}

TEST(Grammar, RefusesBadGrammarsNamingWhereAndWhy) {
  EXPECT_NE(error_of("root ::= item\n").find("rule 'item' is used but never defined"), std::string::npos);
  EXPECT_NE(error_of("start ::= \"a\"\n").find("no rule 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"\n").find("'root' is left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= x\nx ::= y? x \"a\" | \"b\"\ny ::= \"c\"\n").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"abc\n").find("unterminated string literal"), std::string::npos);
  EXPECT_NE(error_of("root ::= [z-a]\n").find("line 1, column 10: character range U+007A-U+0061 is reversed"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\\q\"\n").find("unknown escape '\\q'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{2000}\n").find("repetition count 2000 exceeds the limit 1000"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,2}\n").find("n < m"), std::string::npos);
  EXPECT_NE(error_of("root ::= ( \"a\"\n").find("unclosed '('"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\n\nroot ::= \"b\"\n").find("line 3, column 1: rule 'root' is defined twice"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= @\n").find("unexpected '@'"), std::string::npos);
  EXPECT_EQ(error_of("root ::= \"a\" |\n  \"b\" # continued\n"), "(no error)");
}

// A random regular expression over a small alphabet with multi-byte letters, as a GBNF element
// and as an ECMAScript regex over bytes (every multi-byte letter grouped so that it repeats
// whole).
struct Both {
  std::string gbnf, regex;
};

const std::vector<std::string> kLetters = {"a", "b", "c", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};

// Repetitions do not nest: libstdc++'s std::regex backtracks exponentially on nested ones.
Both random_expression(std::mt19937& rng, int depth, bool repeated = false) {
  int kind = depth <= 0 ? static_cast<int>(rng() % 2) : static_cast<int>(rng() % 8);
  if (repeated && kind >= 4) kind = 2 + static_cast<int>(rng() % 2);
  const bool below = repeated || kind >= 4;
  auto sub = [&] { return random_expression(rng, depth - 1, below); };
  switch (kind) {
    case 0: {
      const std::string& l = kLetters[rng() % kLetters.size()];
      return {"\"" + l + "\"", "(?:" + l + ")"};
    }
    case 1: {
      // An ASCII class: the same bytes in both languages.
      std::string cls;
      for (char c : std::string("abc")) {
        if (rng() % 2) cls += c;
      }
      if (cls.empty()) cls = "b";
      const bool negate = rng() % 4 == 0;
      if (negate) return {"[^" + cls + "\\x80-\\U0010FFFF]", "[^" + cls + "\\x80-\\xff]"};
      return {"[" + cls + "]", "[" + cls + "]"};
    }
    case 2: {
      const Both x = sub(), y = sub();
      return {"(" + x.gbnf + " " + y.gbnf + ")", "(?:" + x.regex + y.regex + ")"};
    }
    case 3: {
      const Both x = sub(), y = sub();
      return {"(" + x.gbnf + " | " + y.gbnf + ")", "(?:" + x.regex + "|" + y.regex + ")"};
    }
    case 4: {
      const Both x = sub();
      return {"(" + x.gbnf + ")*", "(?:" + x.regex + ")*"};
    }
    case 5: {
      const Both x = sub();
      return {"(" + x.gbnf + ")+", "(?:" + x.regex + ")+"};
    }
    case 6: {
      const Both x = sub();
      return {"(" + x.gbnf + ")?", "(?:" + x.regex + ")?"};
    }
    default: {
      const Both x = sub();
      const int m = static_cast<int>(rng() % 3), n = m + static_cast<int>(rng() % 3);
      const std::string r = rng() % 3 == 0 ? "{" + std::to_string(m) + ",}" : "{" + std::to_string(m) + "," + std::to_string(n) + "}";
      return {"(" + x.gbnf + ")" + r, "(?:" + x.regex + ")" + r};
    }
  }
}

TEST(Grammar, AutomatonAgreesWithStdRegexOnRandomRegularLanguages) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  int positives = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const Both e = random_expression(rng, 4);
    SCOPED_TRACE("grammar: root ::= " + e.gbnf + "\nregex: " + e.regex + "\nseed " + std::to_string(seed));
    const auto a = compile("root ::= " + e.gbnf + "\n");
    const std::regex re(e.regex, std::regex::ECMAScript);
    std::vector<std::string> texts;
    for (int i = 0; i < 30; ++i) texts.push_back(testing::random_text(kLetters, rng, 5));
    for (int i = 0; i < 30; ++i) texts.push_back(testing::random_sentence(*a, kLetters, rng, 12));
    for (const std::string& t : texts) {
      const bool want = std::regex_match(t, re);
      ASSERT_EQ(accepts(*a, t), want) << "text '" << t << "'";
      positives += want;
      if (!want) continue;
      // Every prefix of a sentence keeps a parse alive.
      MatchState st = a->start();
      for (char c : t) {
        st = a->advance(st, static_cast<uint8_t>(c));
        ASSERT_FALSE(st.dead()) << "a prefix of '" << t << "' was refused";
      }
    }
  }
  EXPECT_GT(positives, 500);  // the walks find sentences, so both answers are exercised
}

// A random grammar with nesting (recursion through brackets), for rollback and masks.
const char* kNested = R"(
  root  ::= item ("," item)*
  item  ::= word | "[" root? "]" | "\"" char* "\""
  word  ::= [a-c]+ | "\u00e9t\u00e9" | "\u20ac"{1,2}
  char  ::= [^"\\] | "\\" ["\\n]
)";

TEST(Grammar, RollbackRestoresExactlyTheStateOfThePrefix) {
  const auto a = compile(kNested);
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int trial = 0; trial < 40; ++trial) {
    // A sentence cut into random tokens (which may split multi-byte code points).
    std::string text = "[ab,\"x\\\"\xC3\xA9\",[\xE2\x82\xAC\xE2\x82\xAC,[]],c]";
    if (trial % 2) text = "abc,\"\xF0\x9F\x98\x80\",[[\xC3\xA9t\xC3\xA9]]";
    std::vector<std::string> tokens;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min(text.size() - i, static_cast<size_t>(1 + rng() % 4));
      tokens.push_back(text.substr(i, n));
      i += n;
    }
    GrammarMatcher m(a);
    std::vector<MatchState> seen = {m.state()};
    for (const std::string& t : tokens) {
      ASSERT_TRUE(m.accept_token(t)) << "token '" << t << "' of " << text;
      seen.push_back(m.state());
    }
    EXPECT_TRUE(m.can_end());
    const int back = static_cast<int>(rng() % (tokens.size() + 1));
    m.rollback(back);
    EXPECT_EQ(m.accepted_tokens(), static_cast<int>(tokens.size()) - back);
    EXPECT_TRUE(m.state() == seen[tokens.size() - static_cast<size_t>(back)]);
    // Replaying the rolled-back tokens gives the same states again.
    for (size_t i = tokens.size() - static_cast<size_t>(back); i < tokens.size(); ++i) {
      ASSERT_TRUE(m.accept_token(tokens[i]));
      EXPECT_TRUE(m.state() == seen[i + 1]);
    }
  }
  GrammarMatcher m(a);
  EXPECT_THROW(m.rollback(1), Error);
}

TEST(Grammar, TokenMasksEqualFeedingEveryTokenAlone) {
  const auto a = compile(kNested);
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  // A vocabulary of grammar pieces, random byte strings, split multi-byte code points and an
  // empty (special) token.
  std::vector<std::string> vocab = {"", "[", "]", ",", "\"", "\\", "a", "ab", "abc", "\xC3", "\xA9", "\xC3\xA9", "t",
                                    "\xE2\x82", "\xAC", "\xE2\x82\xAC", "[[", "],", "\",\"", "\xF0\x9F\x98\x80", "\xFF"};
  for (int i = 0; i < 300; ++i) {
    std::string t;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < n; ++j) t += static_cast<char>("abc[],\"\\\xC3\xA9\xE2\x82\xACt "[rng() % 16]);
    vocab.push_back(t);
  }
  const TokenTrie trie(vocab);
  GrammarMatcher m(a);
  int checked = 0, allowed = 0;
  for (int step = 0; step < 60; ++step) {
    std::vector<uint32_t> mask;
    trie.fill_mask(*a, m.state(), mask);
    std::vector<int> accepted;
    for (size_t id = 0; id < vocab.size(); ++id) {
      MatchState st = m.state();
      bool alive = !vocab[id].empty();
      for (char c : vocab[id]) {
        if (!alive) break;
        st = a->advance(st, static_cast<uint8_t>(c));
        alive = !st.dead();
      }
      const bool bit = (mask[id / 32] >> (id % 32)) & 1u;
      ASSERT_EQ(bit, alive) << "token " << id << " '" << vocab[id] << "' at step " << step;
      ++checked;
      if (alive) accepted.push_back(static_cast<int>(id));
    }
    allowed += static_cast<int>(accepted.size());
    if (accepted.empty()) break;
    ASSERT_TRUE(m.accept_token(vocab[static_cast<size_t>(accepted[rng() % accepted.size()])]));
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(allowed, 60);
}

TEST(Grammar, MultiByteCodePointsMaySpanTokens) {
  const auto a = compile("root ::= [^a] \"\\u20ac\" .\n");
  GrammarMatcher m(a);
  EXPECT_FALSE(m.accept_token("a"));
  EXPECT_TRUE(m.accept_token("\xC3"));   // the first byte of U+00E9
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_token("A"));     // not a continuation byte
  EXPECT_TRUE(m.accept_token("\xA9\xE2"));
  EXPECT_FALSE(m.accept_token("\x82\xAD"));  // U+20AD, not U+20AC
  EXPECT_TRUE(m.accept_token("\x82\xAC\xF0\x9F"));
  EXPECT_TRUE(m.accept_token("\x98\x80"));   // U+1F600 matches '.'
  EXPECT_TRUE(m.can_end());
  // Overlong forms and surrogates are not code points.
  const auto any = compile("root ::= .\n");
  EXPECT_FALSE(accepts(*any, "\xC0\xAF"));
  EXPECT_FALSE(accepts(*any, "\xED\xA0\x80"));
  EXPECT_TRUE(accepts(*any, "\xED\x9F\xBF"));
}

TEST(Grammar, EveryAcceptedBytePrefixCanStillFinish) {
  // A lead byte is accepted only when some code point it can begin (not overlong, not a
  // surrogate) fits: after "\xE0" only U+0800.. can follow, so an ASCII class refuses it.
  const auto ascii = compile("root ::= [A-Z]{2} \"-\" [0-9]\n");
  GrammarMatcher m(ascii);
  EXPECT_FALSE(m.accept_token("\xE0"));
  EXPECT_FALSE(m.accept_token("\xC2"));
  EXPECT_FALSE(m.accept_token("\xF0"));
  const auto latin = compile("root ::= [\\x80-\\xFF]\n");
  GrammarMatcher l(latin);
  EXPECT_TRUE(l.accept_token("\xC2"));
  EXPECT_FALSE(l.accept_token("\xE0"));
  // Random walks over single bytes: wherever the text cannot end, some byte continues it.
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const TokenTrie trie(bytes);
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const char* text : {"root ::= [A-Z]{2,5} \"-\" [0-9]{1,5}\n", "root ::= [a-z\\u00e9\\u4e16]+ \"!\"\n",
                           "root ::= [\\u0800-\\uD7FF] [\\U00010000-\\U0010FFFF] \"x\"\n", kNested}) {
    const auto a = compile(text);
    for (int walk = 0; walk < 40; ++walk) {
      GrammarMatcher g(a);
      for (int step = 0; step < 30; ++step) {
        std::vector<uint32_t> mask;
        trie.fill_mask(*a, g.state(), mask);
        std::vector<int> ok;
        for (int b = 0; b < 256; ++b) {
          if ((mask[static_cast<size_t>(b) / 32] >> (b % 32)) & 1u) ok.push_back(b);
        }
        if (ok.empty()) {
          ASSERT_TRUE(g.can_end()) << text << ": a live state with no byte to continue";
          break;
        }
        if (g.can_end() && rng() % 4 == 0) break;
        ASSERT_TRUE(g.accept_token(bytes[static_cast<size_t>(ok[rng() % ok.size()])]));
      }
    }
  }
}

}  // namespace
}  // namespace specula::grammar
