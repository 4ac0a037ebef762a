// The parser: tokens -> Program, following jinja2's grammar (jinja2/parser.py) for operator
// precedence, filters, tests, slices and statements. Statements outside the supported subset
// (include, import, extends, block, ...) are refused here, at parse time, with their name.
#pragma once

#include <string_view>

#include "specula/jinja/ast.h"

namespace specula::jinja {

// Expression nodes nested deeper than this, or statements nested deeper than kMaxStatementNesting,
// are refused: evaluating and destroying the tree is recursive, and hostile templates must not
// be able to exhaust the stack.
inline constexpr int kMaxExpressionDepth = 128;
inline constexpr int kMaxStatementNesting = 64;
// Parentheses, brackets and unary operators recurse in the parser itself (about a dozen frames
// per level), so they get a tighter bound; Python's jinja2 hits its recursion limit near here.
inline constexpr int kMaxParseNesting = 48;

// Throws specula::Error "template line L, column C: ..." on any syntax error.
Program parse_template(std::string_view source);

}  // namespace specula::jinja
