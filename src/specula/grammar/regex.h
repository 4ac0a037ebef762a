// Regular expressions as grammars (issue 51's `--regex` and SGLang's `regex` field): an
// ECMAScript subset translated to GBNF, whose sentences are the strings the whole pattern matches.
//
// Supported: literals, escapes (\n \r \t \f \v \0 \\ and escaped punctuation, \xHH, \uHHHH,
// \u{H...}, \d \D \w \W \s \S), classes [...] with ranges, negation and those escapes, `.` (any
// code point but line terminators, as in ECMAScript), groups (...) (?:...) (?<name>...),
// alternation, the quantifiers * + ? {m} {m,} {m,n} and their lazy forms (a constrained decoder
// only cares which strings match, so laziness changes nothing), and ^ / $ at the ends of the
// pattern. Refused with the position and what is supported: backreferences, lookaround, \b / \B,
// anchors elsewhere, and flags.
#pragma once

#include <string>
#include <string_view>

#include "specula/grammar/code_points.h"
#include "specula/grammar/grammar.h"

namespace specula::grammar {

// The GBNF text of the pattern (its rule `root`); throws specula::Error ("regex: position P: ...").
std::string regex_to_gbnf(std::string_view pattern);
// The pattern as one GBNF expression (for use inside a larger grammar) whose every character lies
// in `within`; throws specula::Error where the pattern needs a character outside it.
std::string regex_expression(std::string_view pattern, const CodePointRanges& within);
Grammar compile_regex(std::string_view pattern, const Limits& limits = {});

}  // namespace specula::grammar
