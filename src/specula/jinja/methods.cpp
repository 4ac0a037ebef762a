// Python str and dict methods that chat templates call (content.strip(), message.get('x'),
// content.split('</think>')[-1], '{}'.format(x), ...). Methods that would mutate a value
// (list.append, dict.update) are absent on purpose: transformers renders in jinja2's
// ImmutableSandboxedEnvironment, which refuses them too.
#include <algorithm>

#include "specula/core/error.h"
#include "specula/jinja/interpreter.h"
#include "specula/jinja/operations.h"
#include "specula/jinja/py_format.h"
#include "specula/jinja/unicode.h"

namespace specula::jinja {

namespace {

const std::string& string_arg(const Value& v, std::string_view method) {
  SPECULA_CHECK(v.is_string(), "str.{}() argument must be str, not {}", method, v.type_name());
  return v.str();
}

// strip/lstrip/rstrip(chars=None)
Value strip_method(const std::string& s, const CallArgs& args, bool left, bool right, std::string_view name) {
  ArgBinder a(name, args, {"chars"});
  if (!a.has(0) || a.get(0).is_none()) return Value(unicode::strip(s, left, right));
  const std::string_view chars = string_arg(a.get(0), name);
  return Value(unicode::strip(s, left, right, &chars));
}

// Python's str.split / str.rsplit.
Value split_method(Interpreter& in, const std::string& s, const CallArgs& args, bool from_right) {
  ArgBinder a(from_right ? "rsplit" : "split", args, {"sep", "maxsplit"});
  int64_t maxsplit = a.has(1) ? a.get(1).as_int() : -1;
  std::vector<std::string> parts;
  if (!a.has(0) || a.get(0).is_none()) {
    // Runs of whitespace separate; leading/trailing whitespace yields no empty parts.
    std::vector<std::pair<size_t, size_t>> words;  // byte ranges
    size_t pos = 0;
    while (pos < s.size()) {
      size_t next = pos;
      if (unicode::is_space(unicode::decode(s, next))) {
        pos = next;
        continue;
      }
      const size_t start = pos;
      while (pos < s.size()) {
        next = pos;
        if (unicode::is_space(unicode::decode(s, next))) break;
        pos = next;
      }
      words.emplace_back(start, pos);
    }
    const size_t n = words.size();
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= n) {
      for (const auto& [b, e] : words) parts.push_back(s.substr(b, e - b));
    } else if (!from_right) {
      for (size_t i = 0; i < static_cast<size_t>(maxsplit); ++i) parts.push_back(s.substr(words[i].first, words[i].second - words[i].first));
      // The remainder starts at the next word and keeps everything after it, trailing
      // whitespace included ("  a  b  ".split(None, 1) == ['a', 'b  ']).
      parts.push_back(s.substr(words[static_cast<size_t>(maxsplit)].first));
    } else {
      const size_t keep = n - static_cast<size_t>(maxsplit);
      parts.push_back(s.substr(0, words[keep - 1].second));
      for (size_t i = keep; i < n; ++i) parts.push_back(s.substr(words[i].first, words[i].second - words[i].first));
    }
  } else {
    const std::string& sep = string_arg(a.get(0), "split");
    SPECULA_CHECK(!sep.empty(), "empty separator");
    if (!from_right) {
      size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t hit = s.find(sep, start);
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(start, hit - start));
        start = hit + sep.size();
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      std::vector<std::string> reversed;
      while (maxsplit < 0 || static_cast<int64_t>(reversed.size()) < maxsplit) {
        if (end < sep.size()) break;
        const size_t hit = s.rfind(sep, end - sep.size());
        if (hit == std::string::npos) break;
        reversed.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
        end = hit;
      }
      parts.push_back(s.substr(0, end));
      parts.insert(parts.end(), reversed.rbegin(), reversed.rend());
    }
  }
  in.check_list_size(parts.size());
  ValueList out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::list(std::move(out));
}

// startswith/endswith(prefix or tuple of prefixes)
Value affix_method(const std::string& s, const CallArgs& args, bool start) {
  ArgBinder a(start ? "startswith" : "endswith", args, {"prefix"}, 1);
  const auto test = [&](const Value& v) {
    const std::string& affix = string_arg(v, start ? "startswith" : "endswith");
    if (affix.size() > s.size()) return false;
    return start ? s.compare(0, affix.size(), affix) == 0 : s.compare(s.size() - affix.size(), affix.size(), affix) == 0;
  };
  if (a.get(0).is_list()) {
    for (const Value& v : a.get(0).items()) {
      if (test(v)) return Value(true);
    }
    return Value(false);
  }
  return Value(test(a.get(0)));
}

std::string python_title(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = unicode::decode(s, pos);
    unicode::encode(previous_cased ? unicode::to_lower(cp) : unicode::to_upper(cp), out);
    previous_cased = unicode::is_alpha(cp);
  }
  return out;
}

std::string python_capitalize(const std::string& s) {
  std::string out;
  size_t pos = 0;
  bool first = true;
  while (pos < s.size()) {
    const char32_t cp = unicode::decode(s, pos);
    unicode::encode(first ? unicode::to_upper(cp) : unicode::to_lower(cp), out);
    first = false;
  }
  return out;
}

std::string replace_all(Interpreter& in, const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    const auto chars = iterate(Value(s));
    int64_t done = 0;
    for (const Value& c : chars) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += c.str();
      in.check_string_size(out.size());
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, start);
    if (hit == std::string::npos) break;
    out.append(s, start, hit - start);
    out += to;
    in.check_string_size(out.size());
    start = hit + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  in.check_string_size(out.size());
  return out;
}

// str.format: {} / {0} / {name} fields with !s or !r; format specs are refused.
std::string python_format(Interpreter& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      SPECULA_CHECK(i + 1 < fmt.size() && fmt[i + 1] == '}', "single '}}' encountered in format string");
      out.push_back('}');
      ++i;
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    SPECULA_CHECK(close != std::string::npos, "single '{{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      SPECULA_CHECK(bang + 2 == field.size() && (field[bang + 1] == 's' || field[bang + 1] == 'r'),
                    "unsupported conversion in format field '{{{}}}'", field);
      conversion = field[bang + 1];
      field.resize(bang);
    }
    SPECULA_CHECK(field.find(':') == std::string::npos && field.find('.') == std::string::npos &&
                      field.find('[') == std::string::npos,
                  "format field '{{{}}}' is not supported (only {{}}, {{0}}, {{name}} and !r/!s)", field);
    const Value* arg = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t index = field.empty() ? auto_index++ : std::stoul(field);
      SPECULA_CHECK(index < args.positional.size(), "format(): replacement index {} out of range", index);
      arg = &args.positional[index];
    } else {
      for (const auto& [name, value] : args.keyword) {
        if (name == field) arg = &value;
      }
      SPECULA_CHECK(arg != nullptr, "format(): no keyword argument '{}'", field);
    }
    out += conversion == 'r' ? to_repr(*arg) : to_str(*arg);
    in.check_string_size(out.size());
  }
  return out;
}

int64_t count_occurrences(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(unicode::code_point_count(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

// Byte offset -> code point index, for find()'s result.
int64_t char_index(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(unicode::code_point_count(std::string_view(s).substr(0, byte_offset)));
}

template <typename Predicate>
Value all_chars(const std::string& s, Predicate predicate) {
  if (s.empty()) return Value(false);
  size_t pos = 0;
  while (pos < s.size()) {
    if (!predicate(unicode::decode(s, pos))) return Value(false);
  }
  return Value(true);
}

Value call_str_method(Interpreter& in, const std::string& s, std::string_view name, CallArgs& args) {
  const auto no_args = [&]() { ArgBinder(name, args, {}); };
  if (name == "strip") return strip_method(s, args, true, true, name);
  if (name == "lstrip") return strip_method(s, args, true, false, name);
  if (name == "rstrip") return strip_method(s, args, false, true, name);
  if (name == "split") return split_method(in, s, args, false);
  if (name == "rsplit") return split_method(in, s, args, true);
  if (name == "startswith") return affix_method(s, args, true);
  if (name == "endswith") return affix_method(s, args, false);
  if (name == "upper") return no_args(), Value(unicode::upper(s));
  if (name == "lower") return no_args(), Value(unicode::lower(s));
  if (name == "title") return no_args(), Value(python_title(s));
  if (name == "capitalize") return no_args(), Value(python_capitalize(s));
  if (name == "format") return Value(python_format(in, s, args));
  if (name == "replace") {
    ArgBinder a(name, args, {"old", "new", "count"}, 2);
    return Value(replace_all(in, s, string_arg(a.get(0), name), string_arg(a.get(1), name),
                             a.has(2) ? a.get(2).as_int() : -1));
  }
  if (name == "join") {
    ArgBinder a(name, args, {"iterable"}, 1);
    std::string out;
    bool first = true;
    for (const Value& item : iterate(a.get(0))) {
      if (!first) out += s;
      first = false;
      out += string_arg(item, "join");
      in.check_string_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    ArgBinder a(name, args, {"sub"}, 1);
    const std::string& sub = string_arg(a.get(0), name);
    const size_t at = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (at == std::string::npos) {
      SPECULA_CHECK(name == "find" || name == "rfind", "substring not found");
      return Value(int64_t{-1});
    }
    return Value(char_index(s, at));
  }
  if (name == "count") {
    ArgBinder a(name, args, {"sub"}, 1);
    return Value(count_occurrences(s, string_arg(a.get(0), name)));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ArgBinder a(name, args, {"affix"}, 1);
    const std::string& affix = string_arg(a.get(0), name);
    if (name == "removeprefix") return Value(s.rfind(affix, 0) == 0 ? s.substr(affix.size()) : s);
    const bool ends = s.size() >= affix.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0;
    return Value(ends ? s.substr(0, s.size() - affix.size()) : s);
  }
  if (name == "splitlines") {
    no_args();
    ValueList out;
    for (std::string_view line : unicode::splitlines(s)) out.emplace_back(line);
    return Value::list(std::move(out));
  }
  if (name == "isdigit") return no_args(), all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isspace") return no_args(), all_chars(s, unicode::is_space);
  if (name == "isalpha") return no_args(), all_chars(s, unicode::is_alpha);
  if (name == "isalnum") {
    no_args();
    return all_chars(s, [](char32_t c) { return unicode::is_alpha(c) || (c >= '0' && c <= '9'); });
  }
  if (name == "islower" || name == "isupper") {
    no_args();
    bool cased = false;
    size_t pos = 0;
    while (pos < s.size()) {
      const char32_t c = unicode::decode(s, pos);
      const bool lower = unicode::to_upper(c) != c;
      const bool upper = unicode::to_lower(c) != c;
      if ((name == "islower" && upper) || (name == "isupper" && lower)) return Value(false);
      cased = cased || lower || upper;
    }
    return Value(cased);
  }
  SPECULA_CHECK(false, "str.{}() is not supported", name);
  return {};
}

Value call_dict_method(const Value& dict, std::string_view name, CallArgs& args) {
  const auto& entries = dict.dict_data().entries;
  if (name == "get") {
    ArgBinder a(name, args, {"key", "default"}, 1);
    if (a.get(0).is_string()) {
      if (const Value* v = dict.dict_data().find(a.get(0).str())) return *v;
    }
    return a.get_or(1, Value::none());
  }
  ArgBinder(name, args, {});
  ValueList out;
  out.reserve(entries.size());
  for (const auto& [key, value] : entries) {
    if (name == "items") {
      out.push_back(Value::list({Value(key), value}, true));
    } else if (name == "keys") {
      out.emplace_back(key);
    } else {
      out.push_back(value);
    }
  }
  return Value::list(std::move(out));
}

bool is_str_method(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower", "title",
      "capitalize", "format", "replace", "join", "find", "rfind", "index", "rindex", "count", "removeprefix",
      "removesuffix", "splitlines", "isdigit", "isspace", "isalpha", "isalnum", "islower", "isupper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

}  // namespace

Value find_method(const Value& obj, std::string_view name) {
  if (obj.is_string() && is_str_method(name)) {
    std::string method(name);
    return Value::function("str." + method, [obj, method](Interpreter& in, CallArgs& args) {
      return call_str_method(in, obj.str(), method, args);
    });
  }
  if (obj.is_dict() && !obj.is_namespace() && (name == "items" || name == "keys" || name == "values" || name == "get")) {
    std::string method(name);
    return Value::function("dict." + method, [obj, method](Interpreter&, CallArgs& args) {
      return call_dict_method(obj, method, args);
    }, obj.contains_namespace());
  }
  return {};
}

}  // namespace specula::jinja
