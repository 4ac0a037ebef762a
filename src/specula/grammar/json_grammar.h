// Free-form JSON as a grammar (issue 51's `response_format: {"type": "json_object"}`): RFC 8259
// text whose top-level value is an object, with whitespace between tokens bounded so that a model
// cannot pad forever: up to kMaxJsonSpace spaces or tabs, then at most one line break followed by
// an indentation of up to kMaxJsonIndent (pretty-printed JSON to a depth of 20 at two spaces).
#pragma once

#include <string>

#include "specula/grammar/grammar.h"

namespace specula::grammar {

inline constexpr int kMaxJsonSpace = 4;
inline constexpr int kMaxJsonIndent = 40;

// The GBNF text (rules root, value, object, array, string, number, ws).
std::string json_object_gbnf();
Grammar json_object_grammar();

}  // namespace specula::grammar
