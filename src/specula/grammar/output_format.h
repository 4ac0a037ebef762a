// What a request asks its output to match (issue 51): free text, any JSON object, JSON that
// follows a schema, a regular expression or a GBNF grammar; compiled into the automaton the
// sampler's constraint runs.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "specula/grammar/matcher.h"

namespace specula::grammar {

struct OutputFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema, kRegex, kGrammar };
  Kind kind = Kind::kText;
  std::string source;  // the schema (JSON text), the pattern or the grammar
  std::shared_ptr<const Automaton> automaton;  // set by compile(); null for kText

  bool constrained() const { return kind != Kind::kText; }
};

// "text", "json_object", "json_schema", "regex", "grammar".
std::string_view kind_name(OutputFormat::Kind kind);

// Compiles format.source into format.automaton; throws specula::Error with one line naming what
// is wrong (the keyword, line and column, or limit) and what is supported.
void compile(OutputFormat& format);

}  // namespace specula::grammar
