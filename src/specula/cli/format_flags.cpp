#include "specula/cli/format_flags.h"

#include "specula/core/error.h"
#include "specula/core/json_reader.h"

namespace specula {

namespace {

// Text given inline, or with a leading '@' the contents of that file.
std::string inline_or_file(const std::string& value) {
  return !value.empty() && value[0] == '@' ? read_text_file(value.substr(1)) : value;
}

}  // namespace

void add_format_flags(CLI::App& cmd, FormatFlags& flags) {
  cmd.add_flag("--json-object", flags.json_object, "Constrain the output to a JSON object");
  cmd.add_option("--json-schema", flags.json_schema, "Constrain the output to JSON that follows this schema (@file or inline)");
  cmd.add_option("--regex", flags.regex, "Constrain the output to text the whole regular expression matches");
  cmd.add_option("--grammar", flags.grammar, "Constrain the output to a GBNF grammar (@file or inline)");
}

grammar::OutputFormat output_format(const FormatFlags& flags) {
  using Kind = grammar::OutputFormat::Kind;
  const int given = flags.given();
  SPECULA_CHECK(given <= 1, "--json-object, --json-schema, --regex and --grammar are exclusive; {} were given", given);
  grammar::OutputFormat f;
  if (flags.json_object) f.kind = Kind::kJsonObject;
  if (!flags.json_schema.empty()) f = {Kind::kJsonSchema, inline_or_file(flags.json_schema), nullptr};
  if (!flags.regex.empty()) f = {Kind::kRegex, flags.regex, nullptr};
  if (!flags.grammar.empty()) f = {Kind::kGrammar, inline_or_file(flags.grammar), nullptr};
  grammar::compile(f);
  return f;
}

}  // namespace specula
