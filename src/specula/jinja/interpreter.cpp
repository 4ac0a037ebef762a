// Statement execution and expression evaluation. Scoping follows jinja2: a fresh scope per
// for-loop iteration, macro call, `with` and captured block; `if` shares its parent's.
#include "specula/jinja/interpreter.h"

#include <fmt/format.h>

#include "specula/core/error.h"
#include "specula/jinja/builtins.h"
#include "specula/jinja/operations.h"
#include "specula/jinja/py_format.h"

namespace specula::jinja {

const Value* Scope::find(std::string_view name) const {
  for (const auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Scope::set(std::string name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(std::move(name), std::move(value));
}

namespace {

// Makes `scope` the innermost scope for its lifetime.
class ScopeSwap {
 public:
  ScopeSwap(std::shared_ptr<Scope>& slot, std::shared_ptr<Scope> scope) : slot_(slot), saved_(std::move(slot)) {
    slot_ = std::move(scope);
  }
  ~ScopeSwap() { slot_ = std::move(saved_); }
  ScopeSwap(const ScopeSwap&) = delete;
  ScopeSwap& operator=(const ScopeSwap&) = delete;

 private:
  std::shared_ptr<Scope>& slot_;
  std::shared_ptr<Scope> saved_;
};

std::shared_ptr<Scope> child_of(const std::shared_ptr<Scope>& parent) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  return scope;
}

}  // namespace

Interpreter::DepthGuard::DepthGuard(Interpreter& interpreter) : in(interpreter) {
  if (++in.depth_ > in.options_.max_depth) {
    --in.depth_;
    SPECULA_CHECK(false, "template nested deeper than {} evaluations (runaway macro recursion?)", in.options_.max_depth);
  }
}

Interpreter::Interpreter(const RenderOptions& options) : options_(options), globals_(make_globals()) {}

std::string Interpreter::render(const Program& program, std::vector<std::pair<std::string, Value>> context) {
  root_ = std::make_shared<Scope>();
  root_->vars = std::move(context);
  scope_ = root_;
  std::string out;
  out_ = &out;
  const auto located = [&](const char* what) {
    return fmt::format("template line {}, column {}: {}", loc_.line, loc_.column, what);
  };
  try {
    exec(program.body);
  } catch (const TemplateException& e) {
    throw TemplateException(located(("raise_exception: " + e.template_message()).c_str()), e.template_message());
  } catch (const Error& e) {
    throw Error(located(e.what()));
  } catch (const std::exception& e) {
    throw Error(located(e.what()));
  }
  return out;
}

void Interpreter::charge(uint64_t steps) {
  steps_ += steps;
  SPECULA_CHECK(steps_ <= options_.max_steps, "template exceeded its budget of {} evaluation steps (an endless loop?)",
                options_.max_steps);
}

void Interpreter::check_string_size(size_t bytes) {
  SPECULA_CHECK(bytes <= options_.max_output_bytes, "a string of {} bytes exceeds the limit of {} bytes", bytes,
                options_.max_output_bytes);
  charge(bytes / 16);
}

void Interpreter::check_list_size(size_t items) { charge(items); }

void Interpreter::write(std::string_view text) {
  out_->append(text);
  SPECULA_CHECK(out_->size() <= options_.max_output_bytes, "rendered output exceeds the limit of {} bytes",
                options_.max_output_bytes);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) {
    const std::string* hint = callee.undefined_hint();
    SPECULA_CHECK(false, "{} (so it cannot be called)", hint != nullptr && !hint->empty() ? *hint : "undefined value");
  }
  SPECULA_CHECK(callee.is_function(), "'{}' object is not callable", callee.type_name());
  for (const Value& arg : args.positional) charge(work_of(arg));
  return callee.function_data().call(*this, args);
}

Value Interpreter::apply_filter(std::string_view name, const Value& input, const CallArgs& args) {
  const FilterFunction filter = find_filter(name);
  SPECULA_CHECK(filter != nullptr, "no filter named '{}'", name);
  charge(work_of(input));
  return filter(*this, input, args);
}

bool Interpreter::apply_test(std::string_view name, const Value& input, const CallArgs& args) {
  const TestFunction test = find_test(name);
  SPECULA_CHECK(test != nullptr, "no test named '{}'", name);
  charge(work_of(input));
  return test(*this, input, args);
}

// ---- statements ----

Interpreter::Flow Interpreter::exec(const Body& body) {
  for (const StmtPtr& s : body) {
    const Flow flow = exec(*s);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  DepthGuard guard(*this);
  charge(1);
  loc_ = s.loc;
  switch (s.kind) {
    case StmtKind::kText:
      write(s.text);
      return Flow::kNormal;
    case StmtKind::kOutput: {
      const Value v = eval(*s.expr);
      append_str(v, *out_);
      loc_ = s.loc;
      write({});
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (size_t i = 0; i < s.conditions.size(); ++i) {
        if (eval(*s.conditions[i]).truthy()) return exec(s.bodies[i]);
      }
      return exec(s.else_body);
    case StmtKind::kFor:
      return exec_for(s);
    case StmtKind::kSet:
      assign(s.target, eval(*s.expr));
      return Flow::kNormal;
    case StmtKind::kSetBlock: {
      Value v(capture(s.body, child_of(scope_)));
      if (s.expr) {
        captured_.push_back(std::move(v));
        v = eval(*s.expr);
        captured_.pop_back();
      }
      assign(s.target, v);
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      scope_->set(s.text, make_macro(s));
      return Flow::kNormal;
    case StmtKind::kCallBlock: {
      const Expr& call_expr = *s.expr;
      const Value callee = eval(*call_expr.children[0]);
      CallArgs args;
      eval_args(call_expr, 1, args);
      args.keyword.emplace_back("caller", make_caller(s));
      loc_ = s.loc;
      const Value result = call(callee, args);
      append_str(result, *out_);
      write({});
      return Flow::kNormal;
    }
    case StmtKind::kFilterBlock: {
      captured_.emplace_back(capture(s.body, child_of(scope_)));
      const Value v = eval(*s.expr);
      captured_.pop_back();
      append_str(v, *out_);
      write({});
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      // The values see the outer scope; the names exist only inside the block.
      auto scope = child_of(scope_);
      for (size_t i = 0; i < s.params.size(); ++i) scope->set(s.params[i], eval(*s.defaults[i]));
      ScopeSwap swap(scope_, scope);
      return exec(s.body);
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kScope:
      return exec(s.body);
  }
  return Flow::kNormal;
}

namespace {

void bind_target(const Target& target, const Value& value, Scope& scope) {
  if (!target.unpack) {
    scope.set(target.names[0], value);
    return;
  }
  const ValueList values = iterate(value);
  SPECULA_CHECK(values.size() == target.names.size(), "{} values to unpack (expected {}, got {})",
                values.size() > target.names.size() ? "too many" : "not enough", target.names.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) scope.set(target.names[i], values[i]);
}

}  // namespace

void Interpreter::assign(const Target& target, const Value& value) {
  if (target.attr.empty()) {
    bind_target(target, value, *scope_);
    return;
  }
  const Value ns = lookup(target.names[0]);
  SPECULA_CHECK(ns.is_namespace(), "cannot assign attribute '{}' on '{}': it is not a namespace() object", target.attr,
                target.names[0]);
  SPECULA_CHECK(!value.contains_namespace(), "cannot store a namespace inside the namespace '{}'", target.names[0]);
  DictData& data = ns.mutable_namespace();
  data.set(target.attr, value);
  SPECULA_CHECK(data.depth <= kMaxValueDepth, "value nested more than {} levels deep", kMaxValueDepth);
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s) {
  const Value iterable = eval(*s.expr);
  loc_ = s.loc;
  // Characters are the costly thing to iterate; charge before materialising them.
  charge(iterable.is_string() ? iterable.str().size() * 4 : work_of(iterable));
  ValueList items = iterate(iterable);
  if (s.condition) {
    // The inline `if` filters first, so loop.length and loop.last count only kept items.
    ValueList kept;
    for (Value& item : items) {
      charge(1);
      auto scope = child_of(scope_);
      bind_target(s.target, item, *scope);
      ScopeSwap swap(scope_, scope);
      if (eval(*s.condition).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(s.else_body);
  const auto n = static_cast<int64_t>(items.size());
  auto position = std::make_shared<int64_t>(0);
  const Value cycle = Value::function("loop.cycle", [position](Interpreter&, CallArgs& args) {
    SPECULA_CHECK(!args.positional.empty(), "loop.cycle() needs at least one value");
    return args.positional[static_cast<size_t>(*position) % args.positional.size()];
  });
  for (int64_t i = 0; i < n; ++i) {
    charge(1);
    *position = i;
    auto scope = child_of(scope_);
    bind_target(s.target, items[static_cast<size_t>(i)], *scope);
    std::vector<std::pair<std::string, Value>> loop = {
        {"index", Value(i + 1)},         {"index0", Value(i)},           {"revindex", Value(n - i)},
        {"revindex0", Value(n - i - 1)}, {"first", Value(i == 0)},       {"last", Value(i == n - 1)},
        {"length", Value(n)},            {"depth", Value(int64_t{1})},   {"depth0", Value(int64_t{0})},
        {"cycle", cycle},
    };
    if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
    scope->set("loop", Value::dict(std::move(loop)));
    ScopeSwap swap(scope_, scope);
    if (exec(s.body) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

std::string Interpreter::capture(const Body& body, std::shared_ptr<Scope> scope) {
  std::string text;
  std::string* saved = out_;
  out_ = &text;
  try {
    ScopeSwap swap(scope_, std::move(scope));
    exec(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return text;
}

Value Interpreter::make_macro(const Stmt& s) {
  // The closure is weak: the scope owns the macro value, so a strong pointer back would be a
  // cycle. A macro called after its defining scope ended resolves names from the root.
  std::weak_ptr<Scope> closure = scope_;
  const Stmt* macro = &s;
  return Value::function(s.text, [macro, closure](Interpreter& in, CallArgs& args) {
    return in.call_macro(*macro, closure, args);
  });
}

Value Interpreter::make_caller(const Stmt& s) {
  std::weak_ptr<Scope> closure = scope_;
  const Stmt* block = &s;
  return Value::function("caller", [block, closure](Interpreter& in, CallArgs& args) {
    return in.call_macro(*block, closure, args);
  });
}

Value Interpreter::call_macro(const Stmt& s, const std::weak_ptr<Scope>& closure, CallArgs& args) {
  DepthGuard guard(*this);
  const std::string name = s.kind == StmtKind::kMacro ? s.text : "caller";
  std::shared_ptr<Scope> parent = closure.lock();
  auto scope = child_of(parent ? parent : root_);
  SPECULA_CHECK(args.positional.size() <= s.params.size(), "macro '{}' takes at most {} argument(s), {} given", name,
                s.params.size(), args.positional.size());
  std::vector<bool> given(s.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    scope->set(s.params[i], args.positional[i]);
    given[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    if (key == "caller" && s.kind == StmtKind::kMacro) {
      scope->set("caller", value);
      continue;
    }
    const auto it = std::find(s.params.begin(), s.params.end(), key);
    SPECULA_CHECK(it != s.params.end(), "macro '{}' has no argument named '{}'", name, key);
    const size_t i = static_cast<size_t>(it - s.params.begin());
    SPECULA_CHECK(!given[i], "macro '{}' got multiple values for argument '{}'", name, key);
    scope->set(key, value);
    given[i] = true;
  }
  ScopeSwap swap(scope_, scope);
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (given[i]) continue;
    // Defaults are evaluated per call, inside the macro, so they may use earlier parameters.
    scope->set(s.params[i], s.defaults[i] ? eval(*s.defaults[i])
                                          : Value::undefined("parameter '" + s.params[i] + "' was not provided"));
  }
  return Value(capture(s.body, scope));
}

}  // namespace specula::jinja
