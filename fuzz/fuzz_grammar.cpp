// Fuzzes the grammar engine (specula::grammar) on arbitrary bytes: the text up to the first NUL is
// a GBNF grammar (compiled under small limits; a regular expression when it starts with "re:"), the rest are tokens separated by \x01, fed to a
// matcher with a rollback after every third, and a mask over those tokens after each step. A
// specula::Error is the expected answer to a bad grammar; any other exception, sanitizer report,
// abort or hang is a finding.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "specula/grammar/grammar.h"
#include "specula/grammar/matcher.h"
#include "specula/grammar/regex.h"
#include "specula/grammar/token_mask.h"

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
    const bool regex = text.rfind("re:", 0) == 0;
    auto automaton = std::make_shared<const g::Automaton>(std::make_shared<const g::Grammar>(
        regex ? g::compile_regex(std::string_view(text).substr(3), limits) : g::Grammar::parse(text, limits)));
    g::GrammarMatcher m(automaton);
    const g::TokenTrie trie(tokens);
    std::vector<uint32_t> mask;
    int step = 0;
    for (const std::string& t : tokens) {
      trie.fill_mask(*automaton, m.state(), mask);
      if (m.accept_token(t) && ++step % 3 == 0) m.rollback(1);
      volatile bool end = m.can_end() || m.terminated();
      (void)end;
    }
  });
  return 0;
}
