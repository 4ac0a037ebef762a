// Value construction, Python truthiness/equality/ordering, and argument binding.
#include "specula/jinja/value.h"

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"

namespace specula::jinja {

namespace {
void check_depth(int depth) {
  SPECULA_CHECK(depth <= kMaxValueDepth, "value nested more than {} levels deep", kMaxValueDepth);
}
}  // namespace

const Value* DictData::find(std::string_view key) const {
  if (index) {
    const auto it = index->find(std::string(key));
    return it == index->end() ? nullptr : &entries[it->second].second;
  }
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void DictData::set(std::string key, Value value) {
  depth = std::max(depth, 1 + value.depth());
  contains_namespace = contains_namespace || value.contains_namespace();
  if (const Value* existing = find(key)) {
    *const_cast<Value*>(existing) = std::move(value);
    return;
  }
  entries.emplace_back(std::move(key), std::move(value));
  if (index) {
    index->emplace(entries.back().first, entries.size() - 1);
  } else if (entries.size() > kIndexThreshold) {
    index = std::make_unique<std::unordered_map<std::string, size_t>>();
    for (size_t i = 0; i < entries.size(); ++i) index->emplace(entries[i].first, i);
  }
}

Value Value::undefined(std::string hint) {
  Value v;
  v.data_ = Undefined{std::make_shared<const std::string>(std::move(hint))};
  return v;
}

Value Value::none() {
  Value v;
  v.data_ = nullptr;
  return v;
}

Value Value::list(ValueList items, bool is_tuple) {
  auto data = std::make_shared<ListData>();
  for (const Value& item : items) {
    data->depth = std::max(data->depth, 1 + item.depth());
    data->contains_namespace = data->contains_namespace || item.contains_namespace();
  }
  check_depth(data->depth);
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  Value v;
  v.data_ = ListPtr(std::move(data));
  return v;
}

Value Value::generator(ValueList items) {
  Value v = list(std::move(items));
  std::const_pointer_cast<ListData>(std::get<ListPtr>(v.data_))->is_generator = true;
  return v;
}

Value Value::dict(std::vector<std::pair<std::string, Value>> entries) {
  auto data = std::make_shared<DictData>();
  data->entries.reserve(entries.size());
  // Later duplicates replace earlier ones, as in a Python dict literal.
  for (auto& [key, value] : entries) data->set(std::move(key), std::move(value));
  check_depth(data->depth);
  Value v;
  v.data_ = DictPtr(std::move(data));
  return v;
}

Value Value::namespace_object(std::vector<std::pair<std::string, Value>> entries) {
  for (const auto& entry : entries) {
    SPECULA_CHECK(!entry.second.contains_namespace(), "a namespace cannot hold another namespace");
  }
  Value v = dict(std::move(entries));
  std::get<DictPtr>(v.data_)->is_namespace = true;
  std::get<DictPtr>(v.data_)->contains_namespace = true;
  return v;
}

Value Value::function(std::string name, NativeFunction call, bool contains_namespace) {
  Value v;
  v.data_ = FunctionPtr(std::make_shared<const FunctionData>(
      FunctionData{std::move(name), std::move(call), contains_namespace}));
  return v;
}

int64_t Value::as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<int64_t>(data_); }

double Value::as_double() const {
  if (is_float()) return std::get<double>(data_);
  return static_cast<double>(as_int());
}

DictData& Value::mutable_namespace() const { return *std::get<DictPtr>(data_); }

const std::string* Value::undefined_hint() const {
  if (!is_undefined()) return nullptr;
  return std::get<Undefined>(data_).hint.get();
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return as_bool();
    case Kind::Int:
      return as_int() != 0;
    case Kind::Float:
      return as_double() != 0.0;
    case Kind::String:
      return !str().empty();
    case Kind::List:
      return is_generator() || !items().empty();
    case Kind::Dict:
      return is_namespace() || !dict_data().entries.empty();
    case Kind::Function:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return is_generator() ? "generator" : is_tuple() ? "tuple" : "list";
    case Kind::Dict: return is_namespace() ? "Namespace" : "dict";
    case Kind::Function: return "function";
  }
  return "?";
}

int Value::depth() const {
  if (is_list()) return list_data().depth;
  if (is_dict()) return dict_data().depth;
  return 0;
}

bool Value::contains_namespace() const {
  if (is_list()) return list_data().contains_namespace;
  if (is_dict()) return dict_data().contains_namespace;
  if (is_function()) return function_data().contains_namespace;
  return false;
}

bool Value::same_object(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::List: return &list_data() == &other.list_data();
    case Kind::Dict: return &dict_data() == &other.dict_data();
    case Kind::Function: return &function_data() == &other.function_data();
    default: return equals(*this, other);
  }
}

bool equals(const Value& a, const Value& b) {
  using Kind = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.str() == b.str();
    case Kind::List: {
      if (a.is_generator() || b.is_generator()) return a.same_object(b);
      if (a.is_tuple() != b.is_tuple()) return false;
      const ValueList& x = a.items();
      const ValueList& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::Dict: {
      if (a.is_namespace() || b.is_namespace()) return a.same_object(b);
      const auto& x = a.dict_data().entries;
      const DictData& y = b.dict_data();
      if (x.size() != y.entries.size()) return false;
      for (const auto& [key, value] : x) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    case Kind::Function:
      return a.same_object(b);
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double();
      const double y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);  // NaN compares equal here; Python says False both ways
    }
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // Byte order of UTF-8 is code point order, which is what Python compares.
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() && !b.is_generator()) {
    const ValueList& x = a.items();
    const ValueList& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  SPECULA_CHECK(false, "'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
  return 0;
}

ArgBinder::ArgBinder(std::string_view callee, const CallArgs& args, std::initializer_list<std::string_view> params,
                     size_t required)
    : bound_(params.size()), given_(params.size(), false) {
  SPECULA_CHECK(args.positional.size() <= params.size(), "{}() takes at most {} argument(s) ({} given)", callee,
                params.size(), args.positional.size());
  for (size_t i = 0; i < args.positional.size(); ++i) {
    bound_[i] = args.positional[i];
    given_[i] = true;
  }
  for (const auto& [name, value] : args.keyword) {
    const auto it = std::find(params.begin(), params.end(), name);
    SPECULA_CHECK(it != params.end(), "{}() got an unexpected keyword argument '{}'", callee, name);
    const size_t i = static_cast<size_t>(it - params.begin());
    SPECULA_CHECK(!given_[i], "{}() got multiple values for argument '{}'", callee, name);
    bound_[i] = value;
    given_[i] = true;
  }
  for (size_t i = 0; i < required; ++i) {
    SPECULA_CHECK(given_[i], "{}() missing required argument '{}'", callee, *(params.begin() + i));
  }
}

}  // namespace specula::jinja
