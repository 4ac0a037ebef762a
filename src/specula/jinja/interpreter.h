// The tree-walking interpreter: scopes, statements, expression evaluation and the render-wide
// budgets (depth, steps, output size). Filters, tests, methods and globals live in their own
// files and reach the interpreter through the small public surface below.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specula/jinja/ast.h"
#include "specula/jinja/template.h"
#include "specula/jinja/value.h"

namespace specula::jinja {

// Variables of one block. jinja2 gives every for-loop iteration, macro call and `with` block
// its own scope; if/else does not get one. A `{% set %}` writes to the innermost scope, so a
// loop body cannot change an outer variable (which is why templates use namespace()).
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const;
  void set(std::string name, Value value);
};

// Rough work of reading a value, charged to the step budget before filters, tests, calls and
// comparisons so that repeating O(n) work on big values cannot run unbounded.
inline uint64_t work_of(const Value& v) {
  if (v.is_string()) return 1 + v.str().size() / 32;
  if (v.is_list()) return 1 + v.items().size();
  if (v.is_dict()) return 1 + v.dict_data().entries.size();
  return 1;
}

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);

  // Renders the program with `context` as its top-level variables.
  std::string render(const Program& program, std::vector<std::pair<std::string, Value>> context);

  // ---- used by filters, tests, methods and globals ----
  const RenderOptions& options() const { return options_; }
  // Adds work to the step budget; throws once it is spent.
  void charge(uint64_t steps);
  // For a string about to be built: throws past max_output_bytes; charges for the copy.
  void check_string_size(size_t bytes);
  // For a list about to be built: charges for the element copies.
  void check_list_size(size_t items);
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(std::string_view name, const Value& input, const CallArgs& args);
  bool apply_test(std::string_view name, const Value& input, const CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct DepthGuard {
    Interpreter& in;
    explicit DepthGuard(Interpreter& interpreter);
    ~DepthGuard() { --in.depth_; }
  };

  Flow exec(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  void assign(const Target& target, const Value& value);
  // Renders body into a string of its own (macros, block set, filter and call blocks).
  std::string capture(const Body& body, std::shared_ptr<Scope> scope);
  void write(std::string_view text);

  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_compare(const Expr& e);
  void eval_args(const Expr& e, size_t first, CallArgs& args);
  Value lookup(const std::string& name) const;

  Value make_macro(const Stmt& s);
  Value call_macro(const Stmt& s, const std::weak_ptr<Scope>& closure, CallArgs& args);
  Value make_caller(const Stmt& s);

  RenderOptions options_;
  std::vector<std::pair<std::string, Value>> globals_;
  std::shared_ptr<Scope> root_;
  std::shared_ptr<Scope> scope_;        // the innermost scope
  std::string* out_ = nullptr;          // where text goes (swapped by captures)
  std::vector<Value> captured_;         // inputs of {% filter %} / block set chains
  Location loc_;                        // the node being evaluated, for error messages
  int depth_ = 0;
  uint64_t steps_ = 0;
};

}  // namespace specula::jinja
