// Access, iteration and arithmetic with Python's semantics (see operations.h).
#include "specula/jinja/operations.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "specula/core/error.h"
#include "specula/jinja/interpreter.h"
#include "specula/jinja/py_format.h"
#include "specula/jinja/unicode.h"

namespace specula::jinja {

namespace {

std::string undefined_attr_hint(const Value& obj, std::string_view name) {
  if (const std::string* hint = obj.undefined_hint(); hint != nullptr && !hint->empty()) return *hint;
  return fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name);
}

// Python's PySlice_AdjustIndices: normalises (start, stop, step) for a sequence of `length`.
struct SliceBounds {
  int64_t start, stop, step, count;
};

SliceBounds adjust_slice(int64_t length, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const auto open = [](const Value& v) { return v.is_none() || v.is_undefined(); };
  const auto integer = [](const Value& v) {
    SPECULA_CHECK(v.is_int() || v.is_bool(), "slice indices must be integers or None, not {}", v.type_name());
    return v.as_int();
  };
  const int64_t step = open(step_v) ? 1 : integer(step_v);
  SPECULA_CHECK(step != 0, "slice step cannot be zero");
  int64_t start = 0;
  int64_t stop = 0;
  if (open(start_v)) {
    start = step < 0 ? length - 1 : 0;
  } else {
    start = integer(start_v);
    if (start < 0) {
      start += length;
      if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= length) {
      start = step < 0 ? length - 1 : length;
    }
  }
  if (open(stop_v)) {
    stop = step < 0 ? -1 : length;
  } else {
    stop = integer(stop_v);
    if (stop < 0) {
      stop += length;
      if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= length) {
      stop = step < 0 ? length - 1 : length;
    }
  }
  int64_t count = 0;
  if (step < 0) {
    if (stop < start) count = (start - stop - 1) / (-step) + 1;
  } else if (start < stop) {
    count = (stop - start - 1) / step + 1;
  }
  return {start, stop, step, count};
}

void check_overflow(bool overflow) {
  SPECULA_CHECK(!overflow, "integer overflow (specula's template integers are 64-bit)");
}

int64_t floor_div(int64_t a, int64_t b) {
  SPECULA_CHECK(b != 0, "integer division or modulo by zero");
  SPECULA_CHECK(!(a == std::numeric_limits<int64_t>::min() && b == -1), "integer overflow");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  SPECULA_CHECK(b != 0, "integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value repeat(Interpreter& in, const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (s.empty() || times == 0) return Value(std::string());
    SPECULA_CHECK(static_cast<uint64_t>(times) <= in.options().max_output_bytes / s.size(),
                  "string repetition would exceed {} bytes", in.options().max_output_bytes);
    in.check_string_size(s.size() * static_cast<size_t>(times));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value(std::move(out));
  }
  const ValueList& items = seq.items();
  if (items.empty() || times == 0) return Value::list({}, seq.is_tuple());
  SPECULA_CHECK(static_cast<uint64_t>(times) <= (uint64_t{1} << 24) / items.size(), "list repetition is too large");
  in.check_list_size(items.size() * static_cast<size_t>(times));
  ValueList out;
  out.reserve(items.size() * static_cast<size_t>(times));
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.is_tuple());
}

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    const std::string* hint = a.is_undefined() ? a.undefined_hint() : b.undefined_hint();
    SPECULA_CHECK(false, "{} (used with '{}')", hint != nullptr && !hint->empty() ? *hint : "value is undefined", op);
  }
  SPECULA_CHECK(false, "unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
  std::abort();
}

}  // namespace

Value get_attr(const Value& obj, std::string_view name) {
  if (obj.is_dict()) {
    if (!obj.is_namespace()) {
      Value method = find_method(obj, name);
      if (!method.is_undefined()) return method;
    }
    if (const Value* v = obj.dict_data().find(name)) return *v;
    return Value::undefined(undefined_attr_hint(obj, name));
  }
  if (obj.is_string()) {
    Value method = find_method(obj, name);
    if (!method.is_undefined()) return method;
  }
  return Value::undefined(undefined_attr_hint(obj, name));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict_data().find(key.str())) return *v;
      return get_attr(obj, key.str());
    }
    return Value::undefined("'dict object' has no key " + to_repr(key));
  }
  SPECULA_CHECK(!obj.is_generator(), "'generator' object is not subscriptable");
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t index = key.as_int();
    if (obj.is_list()) {
      const ValueList& items = obj.items();
      const int64_t n = static_cast<int64_t>(items.size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return Value::undefined(obj.type_name() + " index out of range");
      return items[static_cast<size_t>(index)];
    }
    const std::string& s = obj.str();
    if (unicode::is_ascii(s)) {
      const int64_t n = static_cast<int64_t>(s.size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return Value::undefined("string index out of range");
      return Value(std::string(1, s[static_cast<size_t>(index)]));
    }
    const std::vector<size_t> offsets = unicode::code_point_offsets(s);
    const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
    if (index < 0) index += n;
    if (index < 0 || index >= n) return Value::undefined("string index out of range");
    const size_t i = static_cast<size_t>(index);
    return Value(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  if (obj.is_undefined()) return obj;
  return Value::undefined(fmt::format("'{} object' has no item {}", obj.type_name(), to_repr(key)));
}

Value slice(Interpreter& in, const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) return obj;
  SPECULA_CHECK(!obj.is_generator(), "'generator' object is not subscriptable");
  if (obj.is_list()) {
    const ValueList& items = obj.items();
    const SliceBounds b = adjust_slice(static_cast<int64_t>(items.size()), start, stop, step);
    in.check_list_size(static_cast<size_t>(b.count));
    ValueList out;
    out.reserve(static_cast<size_t>(b.count));
    for (int64_t i = 0, at = b.start; i < b.count; ++i, at += b.step) out.push_back(items[static_cast<size_t>(at)]);
    return Value::list(std::move(out), obj.is_tuple());
  }
  SPECULA_CHECK(obj.is_string(), "'{}' object is not subscriptable", obj.type_name());
  const std::string& s = obj.str();
  in.check_string_size(s.size());
  const bool ascii = unicode::is_ascii(s);
  std::vector<size_t> offsets;
  if (!ascii) offsets = unicode::code_point_offsets(s);
  const int64_t n = ascii ? static_cast<int64_t>(s.size()) : static_cast<int64_t>(offsets.size()) - 1;
  const SliceBounds b = adjust_slice(n, start, stop, step);
  std::string out;
  if (b.step == 1 && b.count > 0) {
    const size_t from = ascii ? static_cast<size_t>(b.start) : offsets[static_cast<size_t>(b.start)];
    const size_t to = ascii ? static_cast<size_t>(b.start + b.count) : offsets[static_cast<size_t>(b.start + b.count)];
    return Value(s.substr(from, to - from));
  }
  for (int64_t i = 0, at = b.start; i < b.count; ++i, at += b.step) {
    const size_t k = static_cast<size_t>(at);
    if (ascii) {
      out.push_back(s[k]);
    } else {
      out.append(s, offsets[k], offsets[k + 1] - offsets[k]);
    }
  }
  return Value(std::move(out));
}

ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
      return v.items();
    case Value::Kind::Dict: {
      SPECULA_CHECK(!v.is_namespace(), "'Namespace' object is not iterable");
      ValueList keys;
      keys.reserve(v.dict_data().entries.size());
      for (const auto& entry : v.dict_data().entries) keys.emplace_back(entry.first);
      return keys;
    }
    case Value::Kind::String: {
      ValueList chars;
      const std::string& s = v.str();
      size_t pos = 0;
      while (pos < s.size()) {
        const size_t start = pos;
        unicode::decode(s, pos);
        chars.emplace_back(s.substr(start, pos - start));
      }
      return chars;
    }
    default:
      SPECULA_CHECK(false, "'{}' object is not iterable", v.type_name());
      return {};
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::String:
      SPECULA_CHECK(item.is_string(), "'in <string>' requires string as left operand, not {}", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::List:
      for (const Value& v : container.items()) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Kind::Dict:
      return item.is_string() && container.dict_data().find(item.str()) != nullptr;
    case Value::Kind::Undefined:
      return false;
    default:
      SPECULA_CHECK(false, "argument of type '{}' is not iterable", container.type_name());
      return false;
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(unicode::code_point_count(v.str()));
    case Value::Kind::List:
      SPECULA_CHECK(!v.is_generator(), "object of type 'generator' has no len()");
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.dict_data().entries.size());
    default:
      SPECULA_CHECK(false, "object of type '{}' has no len()", v.type_name());
      return 0;
  }
}

Value negate(const Value& v) {
  if (v.is_float()) return Value(-v.as_double());
  if (v.is_int() || v.is_bool()) {
    SPECULA_CHECK(v.as_int() != std::numeric_limits<int64_t>::min(), "integer overflow");
    return Value(-v.as_int());
  }
  SPECULA_CHECK(false, "bad operand type for unary -: '{}'", v.type_name());
  return {};
}

Value binary_op(Interpreter& in, std::string_view op, const Value& a, const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  const bool any_float = a.is_float() || b.is_float();
  if (op == "+") {
    if (numbers) {
      if (any_float) return Value(a.as_double() + b.as_double());
      int64_t r = 0;
      check_overflow(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (a.is_string() && b.is_string()) {
      in.check_string_size(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() && !b.is_generator()) {
      in.check_list_size(a.items().size() + b.items().size());
      ValueList out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out), a.is_tuple());
    }
    unsupported("+", a, b);
  }
  if (op == "-") {
    if (!numbers) unsupported("-", a, b);
    if (any_float) return Value(a.as_double() - b.as_double());
    int64_t r = 0;
    check_overflow(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
    return Value(r);
  }
  if (op == "*") {
    if (numbers) {
      if (any_float) return Value(a.as_double() * b.as_double());
      int64_t r = 0;
      check_overflow(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    const auto repeatable = [](const Value& v) { return v.is_string() || (v.is_list() && !v.is_generator()); };
    if (repeatable(a) && (b.is_int() || b.is_bool())) return repeat(in, a, b.as_int());
    if (repeatable(b) && (a.is_int() || a.is_bool())) return repeat(in, b, a.as_int());
    unsupported("*", a, b);
  }
  if (op == "/") {
    if (!numbers) unsupported("/", a, b);
    SPECULA_CHECK(b.as_double() != 0.0, "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!numbers) unsupported("//", a, b);
    if (!any_float) return Value(floor_div(a.as_int(), b.as_int()));
    SPECULA_CHECK(b.as_double() != 0.0, "float floor division by zero");
    return Value(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    SPECULA_CHECK(!a.is_string(), "printf-style '%' formatting of strings is not supported; use ~ or format()");
    if (!numbers) unsupported("%", a, b);
    if (!any_float) return Value(floor_mod(a.as_int(), b.as_int()));
    const double x = a.as_double();
    const double y = b.as_double();
    SPECULA_CHECK(y != 0.0, "float modulo");
    double r = std::fmod(x, y);
    if (r != 0.0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  if (op == "**") {
    if (!numbers) unsupported("**", a, b);
    if (!any_float && b.as_int() >= 0) {
      int64_t result = 1;
      int64_t base = a.as_int();
      int64_t exponent = b.as_int();
      while (exponent > 0) {
        if (exponent & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
        exponent >>= 1;
        if (exponent > 0) check_overflow(__builtin_mul_overflow(base, base, &base));
      }
      return Value(result);
    }
    SPECULA_CHECK(!(a.as_double() == 0.0 && b.as_double() < 0), "0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  SPECULA_CHECK(false, "unknown operator '{}'", op);
  return {};
}

}  // namespace specula::jinja
