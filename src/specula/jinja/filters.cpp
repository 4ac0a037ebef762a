// jinja2's built-in filters that chat templates use, with jinja2 3.1's signatures and
// results, and transformers' own tojson (no HTML escaping, non-ASCII kept, json.dumps layout).
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "specula/core/error.h"
#include "specula/jinja/builtins.h"
#include "specula/jinja/interpreter.h"
#include "specula/jinja/operations.h"
#include "specula/jinja/py_format.h"
#include "specula/jinja/unicode.h"

namespace specula::jinja {

Value attribute_path(const Value& value, const Value& attribute) {
  if (!attribute.is_string()) return get_item(value, attribute);
  Value current = value;
  const std::string& path = attribute.str();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    current = digits ? get_item(current, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(current, Value(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

namespace {

// ---- helpers ----

// jinja2's ignore_case: sort and unique keys compare strings lower-cased by default.
Value fold_case(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(unicode::lower(v.str())) : v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

Value make_list(Interpreter& in, ValueList items, bool generator = false) {
  in.check_list_size(items.size());
  return generator ? Value::generator(std::move(items)) : Value::list(std::move(items));
}

// int() and float() of jinja2's Undefined raise instead of returning the default.
void check_defined(const Value& v) {
  if (!v.is_undefined()) return;
  const std::string* hint = v.undefined_hint();
  SPECULA_CHECK(false, "{}", hint != nullptr && !hint->empty() ? *hint : "value is undefined");
}

// ---- filters ----

Value f_abs(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("abs", args, {});
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  SPECULA_CHECK(v.is_int() || v.is_bool(), "bad operand type for abs(): '{}'", v.type_name());
  return v.as_int() < 0 ? negate(v) : Value(v.as_int());
}

Value f_attr(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder a("attr", args, {"name"}, 1);
  SPECULA_CHECK(a.get(0).is_string(), "attr(): the attribute name must be a string");
  return get_attr(v, a.get(0).str());
}

Value f_capitalize(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("capitalize", args, {});
  const std::string s = to_str(v);
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = unicode::decode(s, pos);
    unicode::encode(out.empty() ? unicode::to_upper(cp) : unicode::to_lower(cp), out);
  }
  return Value(std::move(out));
}

Value f_default(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder a("default", args, {"default_value", "boolean"});
  const bool boolean = a.has(1) && a.get(1).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return a.get_or(0, Value(std::string()));
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("dictsort", args, {"case_sensitive", "by", "reverse"});
  SPECULA_CHECK(v.is_dict() && !v.is_namespace(), "dictsort(): expected a dict, got {}", v.type_name());
  const bool case_sensitive = a.has(0) && a.get(0).truthy();
  const std::string by = a.has(1) ? to_str(a.get(1)) : "key";
  SPECULA_CHECK(by == "key" || by == "value", "dictsort(): 'by' must be 'key' or 'value'");
  const bool reverse = a.has(2) && a.get(2).truthy();
  ValueList pairs;
  for (const auto& [key, value] : v.dict_data().entries) pairs.push_back(Value::list({Value(key), value}, true));
  in.charge(pairs.size() * 8);
  const size_t index = by == "key" ? 0 : 1;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const int c = compare(fold_case(x.items()[index], case_sensitive), fold_case(y.items()[index], case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(pairs));
}

Value f_escape(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder("escape", args, {});
  std::string out = html_escape(to_str(v));
  in.check_string_size(out.size());
  return Value(std::move(out));
}

Value f_first(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("first", args, {});
  if (v.is_list()) return v.items().empty() ? Value::undefined("No first item, sequence was empty.") : v.items().front();
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("last", args, {});
  SPECULA_CHECK(!v.is_generator(), "'generator' object is not reversible");
  if (v.is_list()) return v.items().empty() ? Value::undefined("No last item, sequence was empty.") : v.items().back();
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

// Python's float(str): surrounding whitespace allowed, "inf"/"nan" accepted, nothing else.
bool parse_python_float(const std::string& text, double& out) {
  const std::string trimmed(unicode::strip(text, true, true));
  if (trimmed.empty()) return false;
  std::string cleaned;
  for (size_t i = 0; i < trimmed.size(); ++i) {
    const char c = trimmed[i];
    if (c == '_') {
      // Python allows '_' only between digits.
      if (i == 0 || i + 1 >= trimmed.size() || !isdigit(static_cast<unsigned char>(trimmed[i - 1])) ||
          !isdigit(static_cast<unsigned char>(trimmed[i + 1]))) {
        return false;
      }
      continue;
    }
    if (c == 'x' || c == 'X') return false;  // strtod would accept hex floats
    cleaned.push_back(c);
  }
  char* end = nullptr;
  errno = 0;
  out = std::strtod(cleaned.c_str(), &end);
  return end == cleaned.c_str() + cleaned.size();
}

Value f_float(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder a("float", args, {"default"});
  check_defined(v);
  const Value fallback = a.get_or(0, Value(0.0));
  if (v.is_number()) return Value(v.as_double());
  double d = 0;
  if (v.is_string() && parse_python_float(v.str(), d)) return Value(d);
  return fallback;
}

Value f_int(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder a("int", args, {"default", "base"});
  check_defined(v);
  const Value fallback = a.get_or(0, Value(int64_t{0}));
  const int base = a.has(1) ? static_cast<int>(a.get(1).as_int()) : 10;
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value(static_cast<int64_t>(d));
  }
  if (!v.is_string()) return fallback;
  std::string text(unicode::strip(v.str(), true, true));
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  bool negative = false;
  size_t start = 0;
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
    negative = text[0] == '-';
    start = 1;
  }
  int b = base;
  if (text.size() > start + 1 && text[start] == '0') {
    const char p = static_cast<char>(text[start + 1] | 0x20);
    const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed != 0 && (base == 0 || base == prefixed)) {
      b = prefixed;
      start += 2;
    }
  }
  if (b == 0) b = 10;
  uint64_t magnitude = 0;
  const auto result = std::from_chars(text.data() + start, text.data() + text.size(), magnitude, b);
  if (result.ec == std::errc() && result.ptr == text.data() + text.size() && start < text.size() &&
      magnitude <= static_cast<uint64_t>(INT64_MAX)) {
    const auto i = static_cast<int64_t>(magnitude);
    return Value(negative ? -i : i);
  }
  // jinja2 falls back to int(float(value)) for strings like "3.7".
  double d = 0;
  if (base == 10 && parse_python_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
    return Value(static_cast<int64_t>(d));
  }
  return fallback;
}

Value f_indent(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("indent", args, {"width", "first", "blank"});
  std::string prefix = "    ";
  if (a.has(0)) {
    if (a.get(0).is_string()) {
      prefix = a.get(0).str();
    } else {
      const int64_t width = a.get(0).as_int();
      SPECULA_CHECK(width >= 0 && width <= 1024, "indent(): width {} is out of range", width);
      prefix.assign(static_cast<size_t>(width), ' ');
    }
  }
  const bool first = a.has(1) && a.get(1).truthy();
  const bool blank = a.has(2) && a.get(2).truthy();
  SPECULA_CHECK(v.is_string(), "indent(): expected a string, got {}", v.type_name());
  // jinja2 appends "\n" before splitlines() so a trailing newline survives.
  const std::string text = to_str(v) + "\n";
  const auto lines = unicode::splitlines(text);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out.push_back('\n');
      if (blank || !lines[i].empty()) out += prefix;
    }
    out.append(lines[i]);
    in.check_string_size(out.size());
  }
  if (first) out = prefix + out;
  return Value(std::move(out));
}

Value f_items(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder("items", args, {});
  if (v.is_undefined()) return Value::list({});
  SPECULA_CHECK(v.is_dict() && !v.is_namespace(), "Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [key, value] : v.dict_data().entries) out.push_back(Value::list({Value(key), value}, true));
  return make_list(in, std::move(out), true);
}

// Not jinja2 built-ins (transformers has no keys/values filters); offered for convenience.
Value f_keys(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder("keys", args, {});
  SPECULA_CHECK(v.is_dict() || v.is_undefined(), "keys(): expected a dict, got {}", v.type_name());
  return make_list(in, iterate(v));
}

Value f_values(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder("values", args, {});
  SPECULA_CHECK(v.is_dict() || v.is_undefined(), "values(): expected a dict, got {}", v.type_name());
  ValueList out;
  if (v.is_dict()) {
    for (const auto& entry : v.dict_data().entries) out.push_back(entry.second);
  }
  return make_list(in, std::move(out));
}

Value f_join(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("join", args, {"d", "attribute"});
  const std::string separator = a.has(0) ? to_str(a.get(0)) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += separator;
    first = false;
    append_str(a.has(1) ? attribute_path(item, a.get(1)) : item, out);
    in.check_string_size(out.size());
  }
  return Value(std::move(out));
}

Value f_length(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("length", args, {});
  return Value(length(v));
}

Value f_list(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder("list", args, {});
  return make_list(in, iterate(v));
}

Value f_lower(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("lower", args, {});
  return Value(unicode::lower(to_str(v)));
}

Value f_upper(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("upper", args, {});
  return Value(unicode::upper(to_str(v)));
}

// map(attribute='x', default=...) or map('filter', args...)
Value f_map(Interpreter& in, const Value& v, const CallArgs& args) {
  ValueList out;
  const ValueList items = iterate(v);
  if (args.positional.empty()) {
    ArgBinder a("map", args, {"attribute", "default"});
    SPECULA_CHECK(a.has(0), "map(): needs a filter name or attribute=");
    for (const Value& item : items) {
      Value x = attribute_path(item, a.get(0));
      out.push_back(x.is_undefined() && a.has(1) ? a.get(1) : x);
    }
  } else {
    SPECULA_CHECK(args.positional[0].is_string(), "map(): the filter name must be a string");
    const std::string& name = args.positional[0].str();
    CallArgs rest{ValueList(args.positional.begin() + 1, args.positional.end()), args.keyword};
    for (const Value& item : items) out.push_back(in.apply_filter(name, item, rest));
  }
  return make_list(in, std::move(out), true);
}

// select/reject(test, args...), selectattr/rejectattr(attribute, test, args...)
Value select_items(Interpreter& in, const Value& v, const CallArgs& args, bool by_attribute, bool keep_if,
                   std::string_view filter) {
  const size_t skip = by_attribute ? 1 : 0;
  SPECULA_CHECK(args.positional.size() >= skip, "{}(): needs an attribute name", filter);
  SPECULA_CHECK(args.keyword.empty(), "{}(): keyword arguments are not supported", filter);
  const Value attribute = by_attribute ? args.positional[0] : Value();
  std::string test;
  if (args.positional.size() > skip) {
    SPECULA_CHECK(args.positional[skip].is_string(), "{}(): the test name must be a string", filter);
    test = args.positional[skip].str();
  }
  CallArgs test_args;
  if (args.positional.size() > skip + 1) {
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(skip + 1), args.positional.end());
  }
  ValueList out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool passed = test.empty() ? subject.truthy() : in.apply_test(test, subject, test_args);
    if (passed == keep_if) out.push_back(item);
  }
  return make_list(in, std::move(out), true);
}

Value f_select(Interpreter& in, const Value& v, const CallArgs& args) { return select_items(in, v, args, false, true, "select"); }
Value f_reject(Interpreter& in, const Value& v, const CallArgs& args) { return select_items(in, v, args, false, false, "reject"); }
Value f_selectattr(Interpreter& in, const Value& v, const CallArgs& args) {
  return select_items(in, v, args, true, true, "selectattr");
}
Value f_rejectattr(Interpreter& in, const Value& v, const CallArgs& args) {
  return select_items(in, v, args, true, false, "rejectattr");
}

Value f_replace(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("replace", args, {"old", "new", "count"}, 2);
  CallArgs method_args{{Value(to_str(a.get(0))), Value(to_str(a.get(1)))}, {}};
  if (a.has(2) && !a.get(2).is_none()) method_args.positional.push_back(a.get(2));
  return in.call(find_method(Value(to_str(v)), "replace"), method_args);
}

Value f_reverse(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder("reverse", args, {});
  ValueList items = iterate(v);
  std::reverse(items.begin(), items.end());
  if (v.is_string()) {
    std::string out;
    for (const Value& c : items) out += c.str();
    return Value(std::move(out));
  }
  // reversed(list) is an iterator; a generator has no reversed(), so jinja2 builds a list.
  return make_list(in, std::move(items), !v.is_generator());
}

// round(value, precision=0, method='common'): Python's round() (ties to even on the exact
// binary value), or math.ceil/floor.
Value f_round(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder a("round", args, {"precision", "method"});
  const int64_t precision = a.has(0) ? a.get(0).as_int() : 0;
  const std::string method = a.has(1) ? to_str(a.get(1)) : "common";
  SPECULA_CHECK(method == "common" || method == "ceil" || method == "floor",
                "round(): method must be 'common', 'ceil' or 'floor'");
  SPECULA_CHECK(v.is_number(), "round(): expected a number, got {}", v.type_name());
  SPECULA_CHECK(precision >= -20 && precision <= 20, "round(): precision {} is out of range", precision);
  if (method == "common" && !v.is_float()) {
    if (precision >= 0) return Value(v.as_int());  // Python's int.__round__ keeps an int
  }
  const double x = v.as_double();
  if (!std::isfinite(x)) return Value(x);
  if (method != "common") {
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return Value((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
  }
  if (precision == 0) return Value(std::nearbyint(x));
  if (precision > 0) {
    // printf rounds the exact binary value half-to-even, like Python's correctly rounded round().
    char buffer[400];
    std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(precision), x);
    return Value(std::strtod(buffer, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(-precision));
  return Value(std::nearbyint(x / scale) * scale);
}

Value f_safe(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("safe", args, {});
  // Markup(value): a string (autoescape is off in transformers, so the mark itself is moot).
  return Value(to_str(v));
}

Value f_sort(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = a.has(0) && a.get(0).truthy();
  const bool case_sensitive = a.has(1) && a.get(1).truthy();
  ValueList items = iterate(v);
  in.charge(items.size() * 8);
  const auto key = [&](const Value& item) {
    return fold_case(a.has(2) ? attribute_path(item, a.get(2)) : item, case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const int c = compare(key(x), key(y));
    return reverse ? c > 0 : c < 0;
  });
  return make_list(in, std::move(items));
}

Value min_max(Interpreter& in, const Value& v, const CallArgs& args, bool want_max) {
  ArgBinder a(want_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = a.has(0) && a.get(0).truthy();
  const ValueList items = iterate(v);
  in.charge(items.size());
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const auto key = [&](const Value& item) {
    return fold_case(a.has(1) ? attribute_path(item, a.get(1)) : item, case_sensitive);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(key(items[i]), key(items[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_max(Interpreter& in, const Value& v, const CallArgs& args) { return min_max(in, v, args, true); }
Value f_min(Interpreter& in, const Value& v, const CallArgs& args) { return min_max(in, v, args, false); }

Value f_string(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("string", args, {});
  return Value(to_str(v));
}

Value f_sum(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("sum", args, {"attribute", "start"});
  Value total = a.get_or(1, Value(int64_t{0}));
  SPECULA_CHECK(!total.is_string(), "sum() can't sum strings [use ''.join(seq) instead]");
  for (const Value& item : iterate(v)) total = binary_op(in, "+", total, a.has(0) ? attribute_path(item, a.get(0)) : item);
  return total;
}

Value f_title(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("title", args, {});
  // jinja2 capitalises each chunk that follows a run of whitespace, '-', '(', '{', '[' or '<'.
  const std::string s = to_str(v);
  std::string out;
  bool word_start = true;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = unicode::decode(s, pos);
    const bool separator = unicode::is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    unicode::encode(separator ? cp : (word_start ? unicode::to_upper(cp) : unicode::to_lower(cp)), out);
    word_start = separator;
  }
  return Value(std::move(out));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False),
// which replaces jinja2's (HTML-escaping) filter; note the positional order.
Value f_tojson(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions options;
  options.ensure_ascii = a.has(0) && a.get(0).truthy();
  if (a.has(1) && !a.get(1).is_none()) {
    if (a.get(1).is_string()) {
      options.indent_string = a.get(1).str();
      options.indent = 0;
    } else {
      options.indent = static_cast<int>(std::clamp<int64_t>(a.get(1).as_int(), 0, 64));
    }
  }
  if (a.has(2) && !a.get(2).is_none()) {
    const Value& separators = a.get(2);
    SPECULA_CHECK(separators.is_list() && separators.items().size() == 2 && separators.items()[0].is_string() &&
                      separators.items()[1].is_string(),
                  "tojson(): separators must be a pair of strings");
    options.item_separator = separators.items()[0].str();
    options.key_separator = separators.items()[1].str();
  }
  options.sort_keys = a.has(3) && a.get(3).truthy();
  std::string out = to_json(v, options);
  in.check_string_size(out.size());
  return Value(std::move(out));
}

Value f_trim(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder a("trim", args, {"chars"});
  const std::string s = to_str(v);
  if (!a.has(0) || a.get(0).is_none()) return Value(unicode::strip(s, true, true));
  const std::string chars = to_str(a.get(0));
  const std::string_view view(chars);
  return Value(unicode::strip(s, true, true, &view));
}

Value f_unique(Interpreter& in, const Value& v, const CallArgs& args) {
  ArgBinder a("unique", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = a.has(0) && a.get(0).truthy();
  ValueList seen;
  ValueList out;
  for (const Value& item : iterate(v)) {
    const Value key = fold_case(a.has(1) ? attribute_path(item, a.get(1)) : item, case_sensitive);
    in.charge(seen.size() + 1);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return make_list(in, std::move(out), true);
}

Value f_wordcount(Interpreter&, const Value& v, const CallArgs& args) {
  ArgBinder("wordcount", args, {});
  // jinja2 counts \w+ runs.
  const std::string s = to_str(v);
  int64_t count = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = unicode::decode(s, pos);
    const bool word = unicode::is_alpha(cp) || (cp >= '0' && cp <= '9') || cp == '_';
    if (word && !in_word) ++count;
    in_word = word;
  }
  return Value(count);
}

struct FilterEntry {
  std::string_view name;
  FilterFunction function;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},         {"attr", f_attr},         {"capitalize", f_capitalize}, {"count", f_length},
    {"d", f_default},       {"default", f_default},   {"dictsort", f_dictsort},     {"e", f_escape},
    {"escape", f_escape},   {"first", f_first},       {"float", f_float},           {"forceescape", f_escape},
    {"indent", f_indent},   {"int", f_int},           {"items", f_items},           {"join", f_join},
    {"keys", f_keys},       {"last", f_last},         {"length", f_length},         {"list", f_list},
    {"lower", f_lower},     {"map", f_map},           {"max", f_max},               {"min", f_min},
    {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace},   {"reverse", f_reverse},
    {"round", f_round},     {"safe", f_safe},         {"select", f_select},         {"selectattr", f_selectattr},
    {"sort", f_sort},       {"string", f_string},     {"sum", f_sum},               {"title", f_title},
    {"tojson", f_tojson},   {"trim", f_trim},         {"unique", f_unique},         {"upper", f_upper},
    {"values", f_values},   {"wordcount", f_wordcount},
};

}  // namespace

FilterFunction find_filter(std::string_view name) {
  for (const FilterEntry& entry : kFilters) {
    if (entry.name == name) return entry.function;
  }
  return nullptr;
}

}  // namespace specula::jinja
