// compile(OutputFormat&).
#include "specula/grammar/output_format.h"

#include "specula/core/error.h"
#include "specula/grammar/json_grammar.h"
#include "specula/grammar/json_schema.h"
#include "specula/grammar/regex.h"

namespace specula::grammar {

std::string_view kind_name(OutputFormat::Kind kind) {
  switch (kind) {
    case OutputFormat::Kind::kText: return "text";
    case OutputFormat::Kind::kJsonObject: return "json_object";
    case OutputFormat::Kind::kJsonSchema: return "json_schema";
    case OutputFormat::Kind::kRegex: return "regex";
    case OutputFormat::Kind::kGrammar: return "grammar";
  }
  return "?";
}

void compile(OutputFormat& format) {
  format.automaton.reset();
  switch (format.kind) {
    case OutputFormat::Kind::kText: return;
    case OutputFormat::Kind::kJsonObject:
      format.automaton = std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_object_grammar()));
      return;
    case OutputFormat::Kind::kJsonSchema:
      format.automaton = std::make_shared<const Automaton>(std::make_shared<const Grammar>(json_schema_grammar(format.source)));
      return;
    case OutputFormat::Kind::kRegex:
      format.automaton = std::make_shared<const Automaton>(std::make_shared<const Grammar>(compile_regex(format.source)));
      return;
    case OutputFormat::Kind::kGrammar:
      format.automaton = std::make_shared<const Automaton>(std::make_shared<const Grammar>(Grammar::parse(format.source)));
      return;
  }
}

}  // namespace specula::grammar
