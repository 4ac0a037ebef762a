// Expression evaluation: the Interpreter's eval* members, one case per ExprKind.
#include "specula/core/error.h"
#include "specula/jinja/interpreter.h"
#include "specula/jinja/operations.h"
#include "specula/jinja/py_format.h"

namespace specula::jinja {

Value Interpreter::lookup(const std::string& name) const {
  for (const Scope* scope = scope_.get(); scope != nullptr; scope = scope->parent.get()) {
    if (const Value* v = scope->find(name)) return *v;
  }
  for (const auto& [key, value] : globals_) {
    if (key == name) return value;
  }
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::eval(const Expr& e) {
  DepthGuard guard(*this);
  charge(1);
  loc_ = e.loc;
  return eval_inner(e);
}

void Interpreter::eval_args(const Expr& e, size_t first, CallArgs& args) {
  for (size_t i = first; i < e.children.size(); ++i) args.positional.push_back(eval(*e.children[i]));
  for (const auto& [name, expr] : e.keywords) args.keyword.emplace_back(name, eval(*expr));
}

Value Interpreter::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.value;
    case ExprKind::kName:
      return lookup(e.name);
    case ExprKind::kCaptured:
      return captured_.back();
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      items.reserve(e.children.size());
      for (const ExprPtr& child : e.children) items.push_back(eval(*child));
      loc_ = e.loc;
      return Value::list(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      std::vector<std::pair<std::string, Value>> entries;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value key = eval(*e.children[i]);
        SPECULA_CHECK(key.is_string(), "dict literal keys must be strings, got {}", key.type_name());
        entries.emplace_back(key.str(), eval(*e.children[i + 1]));
      }
      loc_ = e.loc;
      return Value::dict(std::move(entries));
    }
    case ExprKind::kGetAttr: {
      const Value obj = eval(*e.children[0]);
      loc_ = e.loc;
      return get_attr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      const Value obj = eval(*e.children[0]);
      const Value key = eval(*e.children[1]);
      loc_ = e.loc;
      charge(work_of(obj));
      return get_item(obj, key);
    }
    case ExprKind::kSlice: {
      const Value obj = eval(*e.children[0]);
      Value bounds[3];
      for (int i = 0; i < 3; ++i) {
        if (e.children[1 + i]) bounds[i] = eval(*e.children[1 + i]);
      }
      loc_ = e.loc;
      charge(work_of(obj));
      return slice(*this, obj, bounds[0], bounds[1], bounds[2]);
    }
    case ExprKind::kCall:
      return eval_call(e);
    case ExprKind::kFilter:
    case ExprKind::kTest: {
      const Value input = eval(*e.children[0]);
      CallArgs args;
      eval_args(e, 1, args);
      loc_ = e.loc;
      if (e.kind == ExprKind::kFilter) return apply_filter(e.name, input, args);
      return Value(apply_test(e.name, input, args));
    }
    case ExprKind::kNeg: {
      const Value v = eval(*e.children[0]);
      loc_ = e.loc;
      return negate(v);
    }
    case ExprKind::kPos: {
      Value v = eval(*e.children[0]);
      loc_ = e.loc;
      SPECULA_CHECK(v.is_number(), "bad operand type for unary +: '{}'", v.type_name());
      return v.is_bool() ? Value(v.as_int()) : v;
    }
    case ExprKind::kNot:
      return Value(!eval(*e.children[0]).truthy());
    case ExprKind::kAnd: {
      // Python's and/or return an operand, not a bool: `x or 'default'`.
      Value left = eval(*e.children[0]);
      return left.truthy() ? eval(*e.children[1]) : left;
    }
    case ExprKind::kOr: {
      Value left = eval(*e.children[0]);
      return left.truthy() ? left : eval(*e.children[1]);
    }
    case ExprKind::kBinary: {
      const Value a = eval(*e.children[0]);
      const Value b = eval(*e.children[1]);
      loc_ = e.loc;
      return binary_op(*this, e.name, a, b);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const ExprPtr& child : e.children) {
        append_str(eval(*child), out);
        loc_ = e.loc;
        check_string_size(out.size());
      }
      return Value(std::move(out));
    }
    case ExprKind::kCompare:
      return eval_compare(e);
    case ExprKind::kCondExpr: {
      if (eval(*e.children[1]).truthy()) return eval(*e.children[0]);
      if (e.children[2]) return eval(*e.children[2]);
      return Value::undefined("the inline if-expression evaluated to false and has no else");
    }
  }
  return {};
}

Value Interpreter::eval_call(const Expr& e) {
  const Expr& callee_expr = *e.children[0];
  Value callee;
  if (callee_expr.kind == ExprKind::kGetAttr) {
    // A method call: the receiver's size is part of the call's cost.
    const Value receiver = eval(*callee_expr.children[0]);
    loc_ = callee_expr.loc;
    charge(work_of(receiver));
    callee = get_attr(receiver, callee_expr.name);
  } else {
    callee = eval(callee_expr);
  }
  CallArgs args;
  eval_args(e, 1, args);
  loc_ = e.loc;
  return call(callee, args);
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.children[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1]);
    loc_ = e.loc;
    charge(work_of(left) + work_of(right));
    const std::string& op = e.ops[i];
    bool result = false;
    if (op == "==") {
      result = equals(left, right);
    } else if (op == "!=") {
      result = !equals(left, right);
    } else if (op == "in") {
      result = contains(right, left);
    } else if (op == "not in") {
      result = !contains(right, left);
    } else {
      if (left.is_undefined() || right.is_undefined()) {
        const std::string* hint = (left.is_undefined() ? left : right).undefined_hint();
        SPECULA_CHECK(false, "{} (compared with '{}')", hint != nullptr ? *hint : "undefined value", op);
      }
      const int c = compare(left, right);
      result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    // Chains like a < b < c stop at the first false link, as in Python.
    if (!result) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace specula::jinja
