// The structured-output flags shared by `specula generate` and `specula bench serve`:
// --json-object, --json-schema, --regex and --grammar (at most one).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "specula/grammar/output_format.h"

namespace specula {

struct FormatFlags {
  bool json_object = false;
  std::string json_schema, regex, grammar;
  // How many of the flags were given.
  int given() const { return (json_object ? 1 : 0) + !json_schema.empty() + !regex.empty() + !grammar.empty(); }
};

void add_format_flags(CLI::App& cmd, FormatFlags& flags);

// The format the flags ask for, compiled (so a bad one is refused before any model loads); kind
// text when none was given.
grammar::OutputFormat output_format(const FormatFlags& flags);

}  // namespace specula
