// Registries of the built-in filters, tests and global functions. Template::parse checks every
// filter and test name against them, so an unknown one fails at parse time as in jinja2.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specula/jinja/value.h"

namespace specula::jinja {

class Interpreter;

using FilterFunction = Value (*)(Interpreter&, const Value& input, const CallArgs& args);
using TestFunction = bool (*)(Interpreter&, const Value& input, const CallArgs& args);

// nullptr when there is no such filter / test.
FilterFunction find_filter(std::string_view name);
TestFunction find_test(std::string_view name);

// range, namespace, dict, raise_exception and strftime_now (which reads RenderOptions::now).
std::vector<std::pair<std::string, Value>> make_globals();

// `value.attribute` for map/selectattr/sort/...: dotted paths, digits index lists ("items.0").
Value attribute_path(const Value& value, const Value& attribute);

}  // namespace specula::jinja
