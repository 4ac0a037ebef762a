// How Python prints values, which is what a rendered chat template contains: str() for
// `{{ x }}`, repr() inside printed lists and dicts, float repr ("1.0", "1e-05"), and
// json.dumps as transformers' tojson filter calls it.
#pragma once

#include <string>

#include "specula/jinja/value.h"

namespace specula::jinja {

// Python's str(): None -> "None", True -> "True", 1.0 -> "1.0", ['a'] -> "['a']"; Undefined -> "".
std::string to_str(const Value& value);
void append_str(const Value& value, std::string& out);
// Python's repr(): strings quoted and escaped as Python does.
std::string to_repr(const Value& value);
// repr() of a float: the shortest string that round-trips, in Python's layout.
std::string float_repr(double value);

struct JsonOptions {
  int indent = -1;                  // < 0: no newlines (json.dumps' indent=None)
  std::string indent_string;        // used when indent was given as a string
  bool ensure_ascii = false;        // transformers' default: keep non-ASCII as is
  bool sort_keys = false;
  std::string item_separator;       // empty: json.dumps' default (", " or "," with an indent)
  std::string key_separator = ": ";
};

// json.dumps(value, ...): throws specula::Error for values JSON cannot hold (Undefined,
// functions, namespaces), as Python raises TypeError.
std::string to_json(const Value& value, const JsonOptions& options = {});

}  // namespace specula::jinja
