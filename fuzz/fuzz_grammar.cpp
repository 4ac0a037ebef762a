// Fuzzes the grammar engine (specula::grammar) on arbitrary bytes: the text up to the first NUL is
// a GBNF grammar (compiled under small limits; a regular expression when it starts with "re:", a
// JSON Schema when it starts with "js:"), the rest are tokens separated by \x01, fed to a matcher
// with a rollback after every third, and a mask over those tokens after each step, by the trie
// walk and by the cached masker, which must agree. A
// specula::Error is the expected answer to a bad grammar; any other exception, sanitizer report,
// abort or hang is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "specula/grammar/grammar.h"
#include "specula/grammar/json_schema.h"
#include "specula/grammar/matcher.h"
#include "specula/grammar/regex.h"
#include "specula/grammar/token_mask.h"
#include "specula/grammar/token_masker.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  std::vector<std::string> tokens;
  if (nul != std::string::npos) {
    // At most 64 tokens: a step's work is bounded by the automaton's limits (Automaton::kMax*),
    // so an input's time grows with its token count alone, and an ambiguous grammar near those
    // limits would otherwise turn a long input into a timeout without a finding.
    for (size_t begin = nul + 1; begin <= input.size() && tokens.size() < 64;) {
      const size_t end = std::min(input.find('\x01', begin), input.size());
      tokens.push_back(input.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  specula::fuzz::guarded([&] {
    namespace g = specula::grammar;
    g::Limits limits;
    limits.max_rules = 300;
    limits.max_elements = 3000;
    limits.max_repeat = 40;
    const std::string_view body = std::string_view(text).substr(std::min<size_t>(3, text.size()));
    const g::Grammar grammar = text.rfind("re:", 0) == 0   ? g::compile_regex(body, limits)
                               : text.rfind("js:", 0) == 0 ? g::Grammar::parse(g::json_schema_to_gbnf(body), limits)
                                                           : g::Grammar::parse(text, limits);
    auto automaton = std::make_shared<const g::Automaton>(std::make_shared<const g::Grammar>(grammar));
    g::GrammarMatcher m(automaton);
    const auto vocabulary = std::make_shared<const g::Vocabulary>(tokens);
    g::TokenMasker masker(automaton, vocabulary);
    std::vector<uint32_t> mask, cached;
    int step = 0;
    for (const std::string& t : tokens) {
      vocabulary->trie.fill_mask(*automaton, m.state(), mask);
      // The cached masks must be the trie walk's exactly.
      masker.fill(m.state(), cached);
      if (cached != mask) {
        std::fprintf(stderr, "fuzz_grammar: the masker's mask differs from the trie walk's\n");
        std::abort();
      }
      if (m.accept_token(t) && ++step % 3 == 0) m.rollback(1);
      volatile bool end = m.can_end() || m.terminated();
      (void)end;
    }
  });
  return 0;
}
