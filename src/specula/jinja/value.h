// Value: the interpreter's dynamic type, modelled on the Python objects jinja2 sees when
// transformers renders a chat template (None, bool, int, float, str, list/tuple, dict,
// callables) plus jinja2's Undefined. Copies are cheap: strings, lists and dicts are shared and
// immutable, except namespace() objects, the one mutable kind (`{% set ns.x = ... %}`), as in
// transformers' ImmutableSandboxedEnvironment where list.append and dict.update are refused.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace specula::jinja {

class Value;
class Interpreter;
struct CallArgs;

using ValueList = std::vector<Value>;

// Lists and dicts deeper than this are refused when built, so printing, tojson, comparison and
// destruction (all recursive) stay within a small, fixed amount of stack.
inline constexpr int kMaxValueDepth = 256;

struct ListData {
  ValueList items;
  bool is_tuple = false;
  // What jinja2's map/select/reject/selectattr/rejectattr/unique/items filters (and reverse on
  // a list) return is a Python generator: always true in an `if`, without len() or indexing.
  // specula materialises it but keeps those observable differences.
  bool is_generator = false;
  int depth = 1;                    // 1 + the deepest element
  bool contains_namespace = false;  // see DictData::is_namespace
};

// An insertion-ordered dict with string keys (JSON objects, dict literals, namespaces).
struct DictData {
  std::vector<std::pair<std::string, Value>> entries;
  // Key -> position, kept only for dicts larger than kIndexThreshold so lookups in big request
  // objects stay O(1) while message-sized dicts use a short linear scan.
  static constexpr size_t kIndexThreshold = 16;
  std::unique_ptr<std::unordered_map<std::string, size_t>> index;
  // namespace() objects are mutable; a namespace may not be stored inside a namespace (directly
  // or nested), which rules out reference cycles and keeps every value a tree.
  bool is_namespace = false;
  int depth = 1;
  bool contains_namespace = false;

  const Value* find(std::string_view key) const;
  // Inserts or replaces in place (order kept); only for building and for namespaces.
  void set(std::string key, Value value);
};

using NativeFunction = std::function<Value(Interpreter&, CallArgs&)>;

struct FunctionData {
  std::string name;  // for messages and repr
  NativeFunction call;
  bool contains_namespace = false;  // a bound method of a value holding a namespace
};

struct Undefined {
  // What was looked up ("'foo' is undefined"), for the error if the value is used.
  std::shared_ptr<const std::string> hint;
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

  Value() = default;  // undefined
  static Value undefined(std::string hint);
  static Value none();
  Value(bool b) : data_(b) {}
  Value(int64_t i) : data_(i) {}
  Value(int i) : data_(static_cast<int64_t>(i)) {}
  Value(double d) : data_(d) {}
  Value(std::string s) : data_(std::make_shared<const std::string>(std::move(s))) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}
  // Lists, tuples and dicts; these throw specula::Error past kMaxValueDepth.
  static Value list(ValueList items, bool is_tuple = false);
  static Value generator(ValueList items);
  static Value dict(std::vector<std::pair<std::string, Value>> entries);
  static Value namespace_object(std::vector<std::pair<std::string, Value>> entries);
  static Value function(std::string name, NativeFunction call, bool contains_namespace = false);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }  // list or tuple
  bool is_tuple() const { return is_list() && list_data().is_tuple; }
  bool is_generator() const { return is_list() && list_data().is_generator; }
  bool is_dict() const { return kind() == Kind::Dict; }  // dict or namespace
  bool is_namespace() const { return is_dict() && dict_data().is_namespace; }
  bool is_function() const { return kind() == Kind::Function; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;  // int or bool
  double as_double() const;  // any number
  const std::string& str() const { return *std::get<StringPtr>(data_); }
  const ListData& list_data() const { return *std::get<ListPtr>(data_); }
  const ValueList& items() const { return list_data().items; }
  const DictData& dict_data() const { return *std::get<DictPtr>(data_); }
  DictData& mutable_namespace() const;  // only for namespaces
  const FunctionData& function_data() const { return *std::get<FunctionPtr>(data_); }
  const std::string* undefined_hint() const;

  // Python truthiness (jinja2's Undefined is false).
  bool truthy() const;
  // Python's type name, for error messages ("'int' object is not iterable").
  std::string type_name() const;
  int depth() const;
  bool contains_namespace() const;
  bool same_object(const Value& other) const;  // Python's `is` for shared kinds

 private:
  using StringPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const ListData>;
  using DictPtr = std::shared_ptr<DictData>;
  using FunctionPtr = std::shared_ptr<const FunctionData>;
  // The order matches Kind.
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, StringPtr, ListPtr, DictPtr, FunctionPtr> data_;
};

// Python's == (1 == 1.0 == True; list vs tuple differ; dict order does not matter).
bool equals(const Value& a, const Value& b);
// Python's < ordering for numbers, strings (code point order) and lists; throws for other pairs.
int compare(const Value& a, const Value& b);

struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Binds CallArgs to a Python-style signature: positional first, then by keyword; unknown or
// duplicate keywords and surplus positionals are errors naming the callee.
class ArgBinder {
 public:
  ArgBinder(std::string_view callee, const CallArgs& args, std::initializer_list<std::string_view> params,
            size_t required = 0);
  bool has(size_t i) const { return given_[i]; }
  const Value& get(size_t i) const { return bound_[i]; }
  Value get_or(size_t i, Value fallback) const { return has(i) ? bound_[i] : std::move(fallback); }

 private:
  std::vector<Value> bound_;
  std::vector<bool> given_;
};

}  // namespace specula::jinja
