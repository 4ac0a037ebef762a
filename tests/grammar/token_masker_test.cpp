// TokenMasker's cached classification against brute force (every token fed alone, byte by byte,
// from the matcher's state) over a vocabulary rich in non-ASCII text: whole code points of every
// length and runs of them, code points split across tokens, and byte strings that are not UTF-8
// (lone continuation bytes, overlong forms, surrogates, bytes no sequence starts with). The
// grammars' character classes take every non-ASCII code point (unbounded and bounded runs, a JSON
// string's body), some of them, or none, alone and side by side in one state, which is where the
// classification takes whole subtrees of the vocabulary without walking them.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "specula/grammar/grammar.h"
#include "specula/grammar/json_grammar.h"
#include "specula/grammar/mask_warmer.h"
#include "specula/grammar/matcher.h"
#include "specula/grammar/token_constraint.h"
#include "specula/grammar/token_masker.h"
#include "specula/model/utf8.h"

namespace specula::grammar {
namespace {

std::vector<std::string> wide_vocabulary(std::mt19937& rng) {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  const std::vector<std::string> invalid = {"\xC0\xAF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5",
                                            "\xFF", "\x80", "\xBF\xBF"};
  const std::string ascii = "ab xyz\"\\<>(){}[]:,.!0123456789\n-_/T\t";
  const auto code_point = [&] {
    switch (rng() % 4) {
      case 0: return static_cast<uint32_t>(0x80 + rng() % (0x800 - 0x80));
      case 1: return static_cast<uint32_t>(0x4E00 + rng() % 64);  // CJK, inside the class grammar 3 refuses
      case 2: {
        const auto cp = static_cast<uint32_t>(0x800 + rng() % (0x10000 - 0x800));
        return cp >= 0xD800 && cp <= 0xDFFF ? cp - 0x800 : cp;
      }
      default: return static_cast<uint32_t>(0x10000 + rng() % (0x110000 - 0x10000));
    }
  };
  for (int i = 0; i < 6000; ++i) {
    std::string t;
    const int pieces = 1 + static_cast<int>(rng() % 5);
    for (int p = 0; p < pieces; ++p) {
      const unsigned kind = rng() % 10;
      if (kind < 4) {
        t += ascii[rng() % ascii.size()];
      } else if (kind < 8) {
        t += utf8_encode(code_point());
      } else if (kind < 9) {
        const std::string whole = utf8_encode(code_point());
        t += whole.substr(0, 1 + rng() % (whole.size() - 1));  // a code point cut short
      } else {
        t += invalid[rng() % invalid.size()];
      }
    }
    // Sometimes the tail of a code point first, as a token that continues another would start.
    if (rng() % 12 == 0) t = utf8_encode(code_point()).substr(1) + t;
    vocab.push_back(t);
  }
  // Long runs of one code point (a tall subtree, longer than a bounded count allows).
  for (int n = 1; n <= 24; ++n) {
    std::string run;
    for (int i = 0; i < n; ++i) run += utf8_encode(0x4E16);
    vocab.push_back(run);
    vocab.push_back(std::string(static_cast<size_t>(n), 'a') + utf8_encode(0xE9));
    vocab.push_back(std::string(static_cast<size_t>(n), 'x'));
    // Three digits then a non-ASCII code point.
    std::string digits = std::to_string(100 + n * 37);
    digits += n % 2 == 0 ? utf8_encode(0xE9) : utf8_encode(0x4E16);
    vocab.push_back(digits);
  }
  vocab.emplace_back();  // a special token
  return vocab;
}

std::vector<int> brute_force(const Automaton& a, const MatchState& state, const std::vector<std::string>& vocab) {
  std::vector<int> ok;
  for (size_t id = 0; id < vocab.size(); ++id) {
    MatchState st = state;
    bool alive = !vocab[id].empty();
    for (char c : vocab[id]) {
      if (!alive) break;
      st = a.advance(st, static_cast<uint8_t>(c));
      alive = !st.dead();
    }
    if (alive) ok.push_back(static_cast<int>(id));
  }
  return ok;
}

// The ids whose bits a mask sets.
std::vector<int> set_bits(const std::vector<uint32_t>& mask, size_t vocab_size) {
  std::vector<int> ids;
  for (size_t id = 0; id < vocab_size; ++id) {
    if ((mask[id / 32] >> (id % 32)) & 1u) ids.push_back(static_cast<int>(id));
  }
  return ids;
}

// `walks` random walks of up to 25 tokens from the start of `a`: at each step the masker's mask
// must be the tokens a brute-force check of every token accepts. Adds the steps compared, and the
// accepted tokens that start with a non-ASCII byte (when wide_accepted is given).
void expect_walks_match_brute_force(TokenMasker& masker, const std::shared_ptr<const Automaton>& a,
                                    const std::vector<std::string>& vocab, std::mt19937& rng, int walks,
                                    int& compared, int* wide_accepted = nullptr) {
  for (int walk = 0; walk < walks; ++walk) {
    GrammarMatcher m(a);
    for (int step = 0; step < 25; ++step) {
      std::vector<uint32_t> mask;
      masker.fill(m.state(), mask);
      const std::vector<int> ok = brute_force(*a, m.state(), vocab);
      ASSERT_EQ(set_bits(mask, vocab.size()), ok) << "walk " << walk << ", step " << step;
      ++compared;
      for (int id : ok) {
        if (wide_accepted != nullptr && static_cast<unsigned char>(vocab[static_cast<size_t>(id)][0]) >= 0x80) {
          ++*wide_accepted;
        }
      }
      if (ok.empty() || (m.can_end() && rng() % 6 == 0)) break;
      ASSERT_TRUE(m.accept_token(vocab[static_cast<size_t>(ok[rng() % ok.size()])]));
    }
  }
}

TEST(TokenMasker, MasksOverNonAsciiTokensEqualFeedingEveryTokenAlone) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::string> vocab = wide_vocabulary(rng);
  const auto vocabulary = std::make_shared<const Vocabulary>(vocab);
  const std::vector<std::string> grammars = {
      // Every non-ASCII code point, unbounded, then a tail the closing quote's tokens run into.
      "root ::= \"\\\"\" [^\"\\\\]* \"\\\"\" \" \" [a-z]+ \"!\"\n",
      // Bounded: each count is a state of its own, and long runs outgrow it.
      "root ::= \"\\\"\" [^\"\\\\]{0,6} \"\\\"\" [0-9]\n",
      // Some non-ASCII code points only.
      "root ::= \"<\" [^>\\u4e00-\\u9fff]* \">\" \".\"\n",
      // Stacks that take every non-ASCII code point beside stacks that take none, in one state.
      "root ::= \"(\" ( .{2,5} | [a-z]* ) \")\" \":\"\n",
      // A count that ends where some non-ASCII code points and the ASCII 'x' still go on.
      "root ::= [^\"]{3} [\\u00e0-\\u00ff x]* \"!\"\n",
      // Only non-ASCII code points.
      "root ::= [\\u0080-\\U0010FFFF]{1,3} \".\" [\\u00e9]+\n",
      // Runs of one ASCII class, bounded and nested (a path pattern), and a date's digit counts.
      "root ::= \"\\\"\" ( [a-z0-9_-]{1,4} \"/\"? ){0,3} \"\\\"\"\n",
      "root ::= [0-9]{4} \"-\" [0-9]{2} \"T\" [ \\t]* \"x\"\n",
      // A run of ASCII digits that ends where only non-ASCII code points go on.
      "root ::= [0-9]{3} [\\u00e9\\u4e16]+ \"!\"\n",
      // Nested: deep stacks (more frames than a cache key holds) inside strings.
      "root ::= item (\",\" item)*\nitem ::= \"[\" ( [^\\]]* | item ) \"]\"\n",
  };
  int compared = 0, wide_accepted = 0;
  for (const std::string& text : grammars) {
    SCOPED_TRACE(text);
    const auto a = std::make_shared<const Automaton>(std::make_shared<const Grammar>(Grammar::parse(text)));
    TokenMasker masker(a, vocabulary);
    expect_walks_match_brute_force(masker, a, vocab, rng, 5, compared, &wide_accepted);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(compared, 100);
  // Non-ASCII tokens were taken, so the subtrees that hold them were classified.
  EXPECT_GT(wide_accepted, 10000);
}

TEST(TokenMasker, JsonStringsOverNonAsciiTokensEqualFeedingEveryTokenAlone) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::string> vocab = wide_vocabulary(rng);
  const auto vocabulary = std::make_shared<const Vocabulary>(vocab);
  const auto a = std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_object_grammar()));
  TokenMasker masker(a, vocabulary);
  int compared = 0;
  for (int walk = 0; walk < 6; ++walk) {
    GrammarMatcher m(a);
    // Into a string value first, so the walk spends its steps inside strings.
    for (const char* piece : {"{", "\"", "k", "\"", ":", "\""}) ASSERT_TRUE(m.accept_token(piece));
    for (int step = 0; step < 30; ++step) {
      std::vector<uint32_t> mask;
      masker.fill(m.state(), mask);
      const std::vector<int> ok = brute_force(*a, m.state(), vocab);
      ASSERT_EQ(set_bits(mask, vocab.size()), ok) << "walk " << walk << ", step " << step;
      ++compared;
      if (ok.empty()) break;
      ASSERT_TRUE(m.accept_token(vocab[static_cast<size_t>(ok[rng() % ok.size()])]));
    }
  }
  EXPECT_GT(compared, 60);
}

// A masker warmed in the background (MaskWarmer: random sentences' masks classified ahead) has
// keys cached before its first request and gives the masks feeding every token alone gives; a
// stopped warm-up classifies nothing.
TEST(TokenMasker, WarmedMasksEqualFeedingEveryTokenAlone) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::string> vocab = wide_vocabulary(rng);
  const auto vocabulary = std::make_shared<const Vocabulary>(vocab);
  std::vector<std::shared_ptr<const Automaton>> automata = {
      std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_object_grammar())),
      std::make_shared<const Automaton>(std::make_shared<const Grammar>(
          Grammar::parse("root ::= item (\",\" item)*\nitem ::= \"[\" ( [^\\]]* | item ) \"]\"\n"))),
      std::make_shared<const Automaton>(std::make_shared<const Grammar>(
          Grammar::parse("root ::= \"\\\"\" ( [a-z0-9_-]{1,4} \"/\"? ){0,3} \"\\\"\" [0-9]{2}\n")))};
  std::vector<std::shared_ptr<TokenMasker>> maskers;
  {
    // Each grammar's budget. The sanitizer build runs the walks several times slower: within 0.5 s
    // a grammar's first sentences there had not yet reached a key it caches (a CI failure), so it
    // gets more time; a warm-up that converges stops before its budget either way.
#if defined(__SANITIZE_ADDRESS__)
    MaskWarmer warmer(5.0);
#else
    MaskWarmer warmer(0.5);
#endif
    for (const auto& a : automata) {
      maskers.push_back(std::make_shared<TokenMasker>(a, vocabulary));
      warmer.add(maskers.back());
    }
    warmer.wait_idle();
    EXPECT_GT(warmer.masks_filled(), 100);
  }
  int compared = 0;
  for (size_t g = 0; g < automata.size(); ++g) {
    const auto& a = automata[g];
    TokenMasker& masker = *maskers[g];
    EXPECT_GT(masker.cached_tops(), 0u) << "grammar " << g;
    SCOPED_TRACE("grammar " + std::to_string(g));
    expect_walks_match_brute_force(masker, a, vocab, rng, 4, compared);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(compared, 40);
  TokenMasker fresh(automata[0], vocabulary);
  const std::atomic<bool> stop{true};
  EXPECT_EQ(fresh.warm_up(10.0, 1, &stop), 0);
  EXPECT_EQ(fresh.cached_tops(), 0u);
}

// TokenConstraint::mask (what a sampled row's logits go through) sets -inf exactly where its
// bitmask is clear and leaves every other logit as it was, over a vocabulary whose last mask word
// is partial and a logit row longer than the vocabulary (ids past it are never allowed), and its
// bits are allows(): along random walks of the JSON grammar, end tokens included.
TEST(TokenConstraint, MaskClearsExactlyTheTokensTheGrammarRefuses) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<std::string> vocab = wide_vocabulary(rng);
  vocab.emplace_back();  // the end token (no bytes)
  const auto end_id = static_cast<int32_t>(vocab.size() - 1);
  ASSERT_NE(vocab.size() % 32, 0u);
  const auto vocabulary = std::make_shared<const Vocabulary>(vocab);
  const auto a = std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_object_grammar()));
  std::normal_distribution<float> logit(0.0f, 3.0f);
  int cleared = 0, kept = 0;
  for (int walk = 0; walk < 4; ++walk) {
    TokenConstraint c(a, vocabulary, {end_id});
    for (int step = 0; step < 40 && !c.terminated(); ++step) {
      std::vector<float> raw(vocab.size() + 40);
      for (float& x : raw) x = logit(rng);
      std::vector<float> got = raw;
      c.mask(got);
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < raw.size(); ++id) {
        const bool ok = id < vocab.size() && c.allows(static_cast<int32_t>(id));
        if (ok) {
          ASSERT_EQ(got[id], raw[id]) << "walk " << walk << ", step " << step << ", id " << id;
          allowed.push_back(static_cast<int32_t>(id));
          ++kept;
        } else {
          ASSERT_EQ(got[id], -INFINITY) << "walk " << walk << ", step " << step << ", id " << id;
          ++cleared;
        }
      }
      ASSERT_FALSE(allowed.empty());
      c.accept(allowed[rng() % allowed.size()]);
    }
  }
  EXPECT_GT(cleared, 1000);
  EXPECT_GT(kept, 100);
}

}  // namespace
}  // namespace specula::grammar
