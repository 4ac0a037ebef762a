// Python's str()/repr()/json.dumps() formatting of Values, byte for byte.
#include "specula/jinja/py_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "specula/core/error.h"
#include "specula/jinja/unicode.h"

namespace specula::jinja {

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits and exponent, then Python's layout (float_repr_style 'short'):
  // fixed notation when the decimal exponent is in [-4, 16), scientific otherwise.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), std::fabs(value), std::chars_format::scientific);
  const std::string_view text(buffer, static_cast<size_t>(result.ptr - buffer));
  const size_t e = text.find('e');
  std::string digits;
  for (char c : text.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(text.data() + e + 1 + (text[e + 1] == '+' ? 1 : 0), text.data() + text.size(), exponent);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decimal_point = exponent + 1;  // digits are 0.d1d2... * 10^decimal_point
  std::string out = value < 0 ? "-" : "";
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decimal_point), '0') + digits;
    } else if (static_cast<size_t>(decimal_point) < digits.size()) {
      out += digits.substr(0, decimal_point) + "." + digits.substr(decimal_point);
    } else {
      out += digits + std::string(decimal_point - digits.size(), '0') + ".0";
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char exp_text[16];
    std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_text;
  }
  return out;
}

namespace {

void append_repr_string(const std::string& s, std::string& out) {
  // Python picks single quotes unless the text has ' and no ".
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out.push_back(quote);
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = unicode::decode(s, pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!unicode::is_printable(cp)) {
      char escape[16];
      if (cp < 0x100) {
        std::snprintf(escape, sizeof(escape), "\\x%02x", static_cast<unsigned>(cp));
      } else if (cp < 0x10000) {
        std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(escape, sizeof(escape), "\\U%08x", static_cast<unsigned>(cp));
      }
      out += escape;
    } else {
      out.append(s, start, pos - start);
    }
  }
  out.push_back(quote);
}

void append_repr(const Value& value, std::string& out) {
  switch (value.kind()) {
    case Value::Kind::String:
      append_repr_string(value.str(), out);
      return;
    case Value::Kind::Undefined:
      out += "Undefined";  // str(Undefined) is "", but its repr inside a list is this
      return;
    case Value::Kind::List: {
      if (value.is_generator()) {
        out += "<generator object>";  // Python adds a memory address; nothing to match here
        return;
      }
      const ValueList& items = value.items();
      out.push_back(value.is_tuple() ? '(' : '[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        append_repr(items[i], out);
      }
      if (value.is_tuple() && items.size() == 1) out.push_back(',');
      out.push_back(value.is_tuple() ? ')' : ']');
      return;
    }
    case Value::Kind::Dict: {
      if (value.is_namespace()) out += "<Namespace ";
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.dict_data().entries) {
        if (!first) out += ", ";
        first = false;
        append_repr_string(key, out);
        out += ": ";
        append_repr(item, out);
      }
      out.push_back('}');
      if (value.is_namespace()) out.push_back('>');
      return;
    }
    default:
      append_str(value, out);
  }
}

}  // namespace

void append_str(const Value& value, std::string& out) {
  switch (value.kind()) {
    case Value::Kind::Undefined:
      return;
    case Value::Kind::None:
      out += "None";
      return;
    case Value::Kind::Bool:
      out += value.as_bool() ? "True" : "False";
      return;
    case Value::Kind::Int:
      out += std::to_string(value.as_int());
      return;
    case Value::Kind::Float:
      out += float_repr(value.as_double());
      return;
    case Value::Kind::String:
      out += value.str();
      return;
    case Value::Kind::List:
    case Value::Kind::Dict:
      append_repr(value, out);
      return;
    case Value::Kind::Function:
      out += "<function " + value.function_data().name + ">";
      return;
  }
}

std::string to_str(const Value& value) {
  if (value.is_string()) return value.str();
  std::string out;
  append_str(value, out);
  return out;
}

std::string to_repr(const Value& value) {
  std::string out;
  append_repr(value, out);
  return out;
}

namespace {

void append_json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = unicode::decode(s, pos);
    char escape[16];
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20) {
      std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned>(cp));
      out += escape;
    } else if (ensure_ascii && cp >= 0x80) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        std::snprintf(escape, sizeof(escape), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += escape;
    } else {
      out.append(s, start, pos - start);
    }
  }
  out.push_back('"');
}

void append_json(const Value& value, const JsonOptions& options, int level, std::string& out) {
  const bool pretty = options.indent >= 0 || !options.indent_string.empty();
  const std::string unit = !options.indent_string.empty() ? options.indent_string
                                                          : std::string(static_cast<size_t>(std::max(options.indent, 0)), ' ');
  const std::string& item_separator =
      !options.item_separator.empty() ? options.item_separator : (pretty ? std::string(",") : std::string(", "));
  const auto newline = [&](int depth) {
    out.push_back('\n');
    for (int i = 0; i < depth; ++i) out += unit;
  };
  switch (value.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += value.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(value.as_int());
      return;
    case Value::Kind::Float: {
      const double d = value.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(d);
      }
      return;
    }
    case Value::Kind::String:
      append_json_string(value.str(), options.ensure_ascii, out);
      return;
    case Value::Kind::List: {
      SPECULA_CHECK(!value.is_generator(), "Object of type generator is not JSON serializable");
      const ValueList& items = value.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_separator;
        if (pretty) newline(level + 1);
        append_json(items[i], options, level + 1, out);
      }
      if (pretty) newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      SPECULA_CHECK(!value.is_namespace(), "Object of type Namespace is not JSON serializable");
      const auto& entries = value.dict_data().entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& entry : entries) order.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out.push_back('{');
      for (size_t i = 0; i < order.size(); ++i) {
        if (i > 0) out += item_separator;
        if (pretty) newline(level + 1);
        append_json_string(order[i]->first, options.ensure_ascii, out);
        out += options.key_separator;
        append_json(order[i]->second, options, level + 1, out);
      }
      if (pretty) newline(level);
      out.push_back('}');
      return;
    }
    case Value::Kind::Undefined:
    case Value::Kind::Function:
      SPECULA_CHECK(false, "Object of type {} is not JSON serializable", value.type_name());
  }
}

}  // namespace

std::string to_json(const Value& value, const JsonOptions& options) {
  std::string out;
  append_json(value, options, 0, out);
  return out;
}

}  // namespace specula::jinja
