// JSON Schema as a grammar (issue 51's `json_schema` response format), after llama.cpp's
// json-schema-to-grammar: the schema becomes GBNF whose sentences are JSON documents the schema
// accepts. Whitespace between tokens is bounded as in json_grammar.h.
//
// Supported: type (one or a list), properties with required (declared order; optional ones may be
// left out), additionalProperties (false, true or a schema; absent counts as false, so that only
// declared keys are generated, which every validator accepts), enum, const, items, prefixItems,
// minItems / maxItems, anyOf, oneOf (as anyOf: exact when its branches do not overlap), allOf of
// object schemas (merged), $ref into #/$defs or #/definitions (recursion allowed), strings with
// minLength / maxLength, pattern (an ECMAScript subset, regex.h, matched whole) and format (date,
// time, date-time, uuid, ipv4, email), integers with minimum / maximum / exclusiveMinimum /
// exclusiveMaximum, numbers with minimum 0 (numbers are generated with at most 16 integer and 16
// fraction digits and a two-digit exponent, so that every parser reads a finite double); annotations (title, description, default, examples,
// $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. Everything else (not,
// if/then/else, patternProperties, uniqueItems, multipleOf, minProperties, contains, ...) is
// refused with one line naming the keyword and where it is.
#pragma once

#include <string>
#include <string_view>

#include "specula/grammar/grammar.h"

namespace specula::grammar {

// The GBNF text (rule `root`); throws specula::Error "json_schema: at <pointer>: ...".
std::string json_schema_to_gbnf(std::string_view schema);
Grammar json_schema_grammar(std::string_view schema);

}  // namespace specula::grammar
