// Template: parse + name checks once, then render with a JSON context converted to Values.
#include "specula/jinja/template.h"

#include "specula/jinja/builtins.h"
#include "specula/jinja/interpreter.h"
#include "specula/jinja/parser.h"

namespace specula::jinja {

namespace {

// jinja2 resolves filter and test names when it compiles a template, so an unknown name fails
// at load time even in a branch that never runs; do the same.
void check_names(const Expr& e) {
  if (e.kind == ExprKind::kFilter) {
    SPECULA_CHECK(find_filter(e.name) != nullptr, "template line {}, column {}: no filter named '{}'", e.loc.line,
                  e.loc.column, e.name);
  } else if (e.kind == ExprKind::kTest) {
    SPECULA_CHECK(find_test(e.name) != nullptr, "template line {}, column {}: no test named '{}'", e.loc.line,
                  e.loc.column, e.name);
  }
  for (const ExprPtr& child : e.children) {
    if (child) check_names(*child);
  }
  for (const auto& [name, child] : e.keywords) check_names(*child);
}

void check_names(const Body& body) {
  for (const StmtPtr& s : body) {
    for (const ExprPtr* e : {&s->expr, &s->condition}) {
      if (*e) check_names(**e);
    }
    for (const ExprPtr& e : s->conditions) check_names(*e);
    for (const ExprPtr& e : s->defaults) {
      if (e) check_names(*e);
    }
    for (const Body& b : s->bodies) check_names(b);
    check_names(s->body);
    check_names(s->else_body);
  }
}

// JSON nesting is bounded before recursing, so a deeply nested request cannot overflow the stack.
Value from_json(const nlohmann::ordered_json& j, int depth) {
  SPECULA_CHECK(depth <= kMaxValueDepth, "context value nested more than {} levels deep", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      // Python ints are unbounded; past int64 we keep the magnitude as a float.
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<int64_t>(u)) : Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get_ref<const std::string&>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> entries;
      entries.reserve(j.size());
      for (const auto& [key, item] : j.items()) entries.emplace_back(key, from_json(item, depth + 1));
      return Value::dict(std::move(entries));
    }
    default:
      SPECULA_CHECK(false, "context values must be JSON (binary values are not supported)");
      return {};
  }
}

}  // namespace

Template Template::parse(std::string_view source) {
  auto program = std::make_shared<Program>(parse_template(source));
  check_names(program->body);
  return Template(std::move(program));
}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  // null (e.g. a default-constructed json) is an empty context.
  SPECULA_CHECK(context.is_object() || context.is_null(), "the template context must be a JSON object, got {}",
                context.type_name());
  std::vector<std::pair<std::string, Value>> variables;
  if (context.is_object()) {
    variables.reserve(context.size());
    for (const auto& [key, value] : context.items()) variables.emplace_back(key, from_json(value, 1));
  }
  Interpreter interpreter(options);
  return interpreter.render(*program_, std::move(variables));
}

}  // namespace specula::jinja
