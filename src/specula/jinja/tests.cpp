// jinja2's built-in tests (`x is defined`, `x is string`, `n is divisibleby 3`, ...), with
// Python's type model: bool counts as a number but not as an integer.
#include "specula/core/error.h"
#include "specula/jinja/builtins.h"
#include "specula/jinja/interpreter.h"
#include "specula/jinja/operations.h"
#include "specula/jinja/py_format.h"
#include "specula/jinja/unicode.h"

namespace specula::jinja {

namespace {

void no_args(std::string_view name, const CallArgs& args) { ArgBinder(name, args, {}); }
Value one_arg(std::string_view name, const CallArgs& args) {
  ArgBinder a(name, args, {"other"}, 1);
  return a.get(0);
}

bool t_defined(Interpreter&, const Value& v, const CallArgs& a) { return no_args("defined", a), !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, const CallArgs& a) { return no_args("undefined", a), v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, const CallArgs& a) { return no_args("none", a), v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, const CallArgs& a) { return no_args("boolean", a), v.is_bool(); }
bool t_true(Interpreter&, const Value& v, const CallArgs& a) { return no_args("true", a), v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, const CallArgs& a) { return no_args("false", a), v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, const CallArgs& a) { return no_args("integer", a), v.is_int(); }
bool t_float(Interpreter&, const Value& v, const CallArgs& a) { return no_args("float", a), v.is_float(); }
bool t_number(Interpreter&, const Value& v, const CallArgs& a) { return no_args("number", a), v.is_number(); }
bool t_string(Interpreter&, const Value& v, const CallArgs& a) { return no_args("string", a), v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, const CallArgs& a) { return no_args("mapping", a), v.is_dict(); }
// jinja2's Undefined defines __call__ (to raise), so Python's callable() says yes.
bool t_callable(Interpreter&, const Value& v, const CallArgs& a) {
  return no_args("callable", a), v.is_function() || v.is_undefined();
}
bool t_escaped(Interpreter&, const Value&, const CallArgs& a) { return no_args("escaped", a), false; }

// Python's iter() succeeds on strings, lists, dicts and jinja2's Undefined.
bool t_iterable(Interpreter&, const Value& v, const CallArgs& a) {
  no_args("iterable", a);
  return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
}

// jinja2: has len() and __getitem__.
bool t_sequence(Interpreter&, const Value& v, const CallArgs& a) {
  no_args("sequence", a);
  return v.is_string() || (v.is_list() && !v.is_generator()) || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
}

// jinja2 computes these with Python's %, so floats work too (2.5 is neither odd nor even).
bool remainder_is(Interpreter& in, const Value& v, const Value& divisor, int64_t expected) {
  const Value r = binary_op(in, "%", v, divisor);
  return equals(r, Value(expected));
}

bool t_odd(Interpreter& in, const Value& v, const CallArgs& a) {
  return no_args("odd", a), remainder_is(in, v, Value(int64_t{2}), 1);
}
bool t_even(Interpreter& in, const Value& v, const CallArgs& a) {
  return no_args("even", a), remainder_is(in, v, Value(int64_t{2}), 0);
}
bool t_divisibleby(Interpreter& in, const Value& v, const CallArgs& a) {
  return remainder_is(in, v, one_arg("divisibleby", a), 0);
}

bool t_eq(Interpreter&, const Value& v, const CallArgs& a) { return equals(v, one_arg("eq", a)); }
bool t_ne(Interpreter&, const Value& v, const CallArgs& a) { return !equals(v, one_arg("ne", a)); }
bool t_lt(Interpreter&, const Value& v, const CallArgs& a) { return compare(v, one_arg("lt", a)) < 0; }
bool t_le(Interpreter&, const Value& v, const CallArgs& a) { return compare(v, one_arg("le", a)) <= 0; }
bool t_gt(Interpreter&, const Value& v, const CallArgs& a) { return compare(v, one_arg("gt", a)) > 0; }
bool t_ge(Interpreter&, const Value& v, const CallArgs& a) { return compare(v, one_arg("ge", a)) >= 0; }
bool t_in(Interpreter&, const Value& v, const CallArgs& a) { return contains(one_arg("in", a), v); }
bool t_sameas(Interpreter&, const Value& v, const CallArgs& a) { return v.same_object(one_arg("sameas", a)); }

// str(value).islower() / .isupper(): some cased character, and none of the other case.
bool t_lower(Interpreter&, const Value& v, const CallArgs& a) {
  no_args("lower", a);
  const std::string s = to_str(v);
  return unicode::lower(s) == s && unicode::upper(s) != s;
}
bool t_upper(Interpreter&, const Value& v, const CallArgs& a) {
  no_args("upper", a);
  const std::string s = to_str(v);
  return unicode::upper(s) == s && unicode::lower(s) != s;
}

struct TestEntry {
  std::string_view name;
  TestFunction function;
};

constexpr TestEntry kTests[] = {
    {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},         {"boolean", t_boolean},
    {"true", t_true},         {"false", t_false},         {"integer", t_integer},   {"float", t_float},
    {"number", t_number},     {"string", t_string},       {"mapping", t_mapping},   {"iterable", t_iterable},
    {"sequence", t_sequence}, {"callable", t_callable},   {"escaped", t_escaped},   {"odd", t_odd},
    {"even", t_even},         {"divisibleby", t_divisibleby}, {"eq", t_eq},         {"equalto", t_eq},
    {"==", t_eq},             {"ne", t_ne},               {"!=", t_ne},             {"lt", t_lt},
    {"lessthan", t_lt},       {"<", t_lt},                {"le", t_le},             {"<=", t_le},
    {"gt", t_gt},             {"greaterthan", t_gt},      {">", t_gt},              {"ge", t_ge},
    {">=", t_ge},             {"in", t_in},               {"sameas", t_sameas},     {"lower", t_lower},
    {"upper", t_upper},
};

}  // namespace

TestFunction find_test(std::string_view name) {
  for (const TestEntry& entry : kTests) {
    if (entry.name == name) return entry.function;
  }
  return nullptr;
}

}  // namespace specula::jinja
