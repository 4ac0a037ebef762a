// A context-free grammar over Unicode code points, compiled from EBNF text in llama.cpp's GBNF
// dialect (issue 51): the automaton's input (grammar/matcher.h).
//
//   root   ::= object                 # the start rule is `root`
//   object ::= "{" ws (pair ("," ws pair)*)? "}"
//   pair   ::= [a-z]+ ":" ws value
//   value  ::= "null" | [0-9]{1,3} | object | [^"\\\x00-\x1f]
//
// Elements: "literals" and [character classes] (ranges, ^ negation, escapes \n \r \t \\ \" \]
// \- \xHH \uHHHH \UHHHHHHHH), `.` (any code point), rule names, ( groups ), and the postfix
// operators * + ? {m} {m,} {m,n}. `#` starts a comment to the end of the line; newlines end a rule
// only where the next line starts a new `name ::=`.
//
// Compiled form: each rule is a list of alternatives, each a sequence of elements (a set of
// code-point ranges, or a reference to a rule); groups and repetitions become generated rules.
// Compilation refuses, with one line naming the position or rule: syntax errors, undefined rules,
// a missing root, left recursion (the automaton would never stop expanding it), and grammars
// over the size limits below.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specula::grammar {

struct Element {
  enum class Kind : uint8_t { kChars, kRule };
  Kind kind = Kind::kChars;
  int rule = -1;                                     // kRule
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // kChars: inclusive code-point ranges, sorted, disjoint

  bool matches(uint32_t cp) const;
};

using Sequence = std::vector<Element>;

struct Rule {
  std::string name;                   // generated rules are named after their parent: "pair#1" (no rule of the text can be)
  std::vector<Sequence> alternatives;  // an empty sequence matches the empty string
};

struct Limits {
  int max_rules = 10000;
  int max_elements = 200000;
  int max_repeat = 1000;  // the largest m or n of {m,n}
};

class Grammar {
 public:
  // Parses and checks `text`; throws specula::Error with one line ("grammar: line L, column C:
  // ..." or naming the rule) on anything it refuses.
  static Grammar parse(std::string_view text, const Limits& limits = {});

  const std::vector<Rule>& rules() const { return rules_; }
  int root() const { return root_; }
  int rule_index(std::string_view name) const;  // -1 when there is none

 private:
  friend class GrammarBuilder;
  std::vector<Rule> rules_;
  int root_ = -1;
};

}  // namespace specula::grammar
