// Python semantics of the operations templates apply to values: attribute and item access,
// slicing, iteration, `in`, len(), and the arithmetic operators. Errors are specula::Error with
// Python's wording; the interpreter adds the template location.
#pragma once

#include <string_view>

#include "specula/jinja/value.h"

namespace specula::jinja {

class Interpreter;

// obj.name: dict methods (items, keys, values, get) and str methods first, then the dict key,
// as jinja2's getattr tries the Python attribute before the item. Missing -> Undefined, also
// for attribute access on Undefined itself (lenient; jinja2 would raise there).
Value get_attr(const Value& obj, std::string_view name);
// obj[key]: dict key, list/tuple/str index (negative from the end), then obj.key for string
// keys; missing or out of range -> Undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] with Python's clamping; None/Undefined bounds are open.
Value slice(Interpreter& in, const Value& obj, const Value& start, const Value& stop, const Value& step);

// The items a for loop, list() or a filter sees: list/tuple items, dict keys, string
// characters; Undefined is empty. Throws for None, numbers and functions.
ValueList iterate(const Value& v);
// Python's `item in container` (substring for strings, key for dicts).
bool contains(const Value& container, const Value& item);
// Python's len().
int64_t length(const Value& v);

// a <op> b for + - * / // % **.
Value binary_op(Interpreter& in, std::string_view op, const Value& a, const Value& b);
Value negate(const Value& v);

// str and dict methods bound to `obj` (str.strip, dict.items, ...), or Undefined.
Value find_method(const Value& obj, std::string_view name);

}  // namespace specula::jinja
