// Global functions of transformers' chat-template environment: jinja2's range/namespace/dict
// (range capped at 100000 items like jinja2's sandbox), and transformers' raise_exception and
// strftime_now.
#include <chrono>
#include <ctime>

#include "specula/core/error.h"
#include "specula/jinja/builtins.h"
#include "specula/jinja/interpreter.h"
#include "specula/jinja/py_format.h"

namespace specula::jinja {

namespace {

// jinja2.sandbox.MAX_RANGE: ranges longer than this raise OverflowError there too.
constexpr int64_t kMaxRange = 100000;

Value g_range(Interpreter& in, CallArgs& args) {
  SPECULA_CHECK(args.keyword.empty(), "range() takes no keyword arguments");
  SPECULA_CHECK(!args.positional.empty() && args.positional.size() <= 3, "range expected 1 to 3 arguments, got {}",
                args.positional.size());
  for (const Value& v : args.positional) {
    SPECULA_CHECK(v.is_int() || v.is_bool(), "'{}' object cannot be interpreted as an integer", v.type_name());
  }
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (args.positional.size() == 1) {
    stop = args.positional[0].as_int();
  } else {
    start = args.positional[0].as_int();
    stop = args.positional[1].as_int();
    if (args.positional.size() == 3) step = args.positional[2].as_int();
  }
  SPECULA_CHECK(step != 0, "range() arg 3 must not be zero");
  // The length in unsigned arithmetic: the distance between any two int64 values fits.
  uint64_t count = 0;
  if (step > 0 && start < stop) {
    count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
  } else if (step < 0 && start > stop) {
    const uint64_t magnitude = static_cast<uint64_t>(-(step + 1)) + 1;  // |step| without overflow
    count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / magnitude + 1;
  }
  SPECULA_CHECK(count <= static_cast<uint64_t>(kMaxRange), "range too big: {} items, the sandbox allows {}", count,
                kMaxRange);
  in.check_list_size(static_cast<size_t>(count));
  ValueList items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) items.emplace_back(start + i * step);
  return Value::list(std::move(items));
}

// namespace(mapping?, **attributes)
Value g_namespace(Interpreter&, CallArgs& args) {
  SPECULA_CHECK(args.positional.size() <= 1, "namespace expected at most 1 positional argument, got {}",
                args.positional.size());
  std::vector<std::pair<std::string, Value>> entries;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    SPECULA_CHECK(source.is_dict() && !source.is_namespace(), "namespace(): the positional argument must be a dict");
    entries = source.dict_data().entries;
  }
  for (auto& entry : args.keyword) entries.push_back(entry);
  return Value::namespace_object(std::move(entries));
}

Value g_dict(Interpreter&, CallArgs& args) {
  SPECULA_CHECK(args.positional.size() <= 1, "dict expected at most 1 positional argument");
  std::vector<std::pair<std::string, Value>> entries;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    SPECULA_CHECK(source.is_dict() && !source.is_namespace(), "dict(): the positional argument must be a dict");
    entries = source.dict_data().entries;
  }
  for (auto& entry : args.keyword) entries.push_back(entry);
  return Value::dict(std::move(entries));
}

Value g_raise_exception(Interpreter&, CallArgs& args) {
  ArgBinder a("raise_exception", args, {"message"}, 1);
  const std::string message = to_str(a.get(0));
  throw TemplateException(message, message);
}

Value g_strftime_now(Interpreter& in, CallArgs& args) {
  ArgBinder a("strftime_now", args, {"format"}, 1);
  SPECULA_CHECK(a.get(0).is_string(), "strftime_now(): the format must be a string");
  const std::string& format = a.get(0).str();
  SPECULA_CHECK(format.size() <= 256, "strftime_now(): format of {} bytes is too long", format.size());
  std::tm now{};
  if (in.options().now) {
    now = in.options().now();
  } else {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    localtime_r(&t, &now);
  }
  if (format.empty()) return Value(std::string());
  // strftime returns 0 both for "too small" and for an empty result; 256 bytes of format can
  // expand to at most a few KB, so one generous buffer decides.
  std::string buffer(8192, '\0');
  const size_t n = std::strftime(buffer.data(), buffer.size(), format.c_str(), &now);
  buffer.resize(n);
  return Value(std::move(buffer));
}

}  // namespace

std::vector<std::pair<std::string, Value>> make_globals() {
  return {
      {"range", Value::function("range", g_range)},
      {"namespace", Value::function("namespace", g_namespace)},
      {"dict", Value::function("dict", g_dict)},
      {"raise_exception", Value::function("raise_exception", g_raise_exception)},
      {"strftime_now", Value::function("strftime_now", g_strftime_now)},
  };
}

}  // namespace specula::jinja
