// Recursive-descent parser mirroring jinja2/parser.py, so precedence matches what chat
// templates were written against (e.g. `a + b | trim` filters only b, `-x | abs` is (-x)|abs).
#include "specula/jinja/parser.h"

#include <algorithm>
#include <cstdlib>

#include "specula/core/error.h"
#include "specula/jinja/lexer.h"

namespace specula::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Program run() {
    Program program;
    program.body = parse_body({});
    return program;
  }

 private:
  // ---- token helpers ----
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  Token next() {
    Token token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }
  static bool is_op(const Token& t, std::string_view op) { return t.type == TokenType::kOperator && t.value == op; }
  static bool is_name(const Token& t, std::string_view name) { return t.type == TokenType::kName && t.value == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(current(), op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(current(), name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kText: return "template text";
      case TokenType::kVariableBegin: return "'{{'";
      case TokenType::kVariableEnd: return "'}}'";
      case TokenType::kBlockBegin: return "'{%'";
      case TokenType::kBlockEnd: return "'%}'";
      case TokenType::kName: return "'" + t.value + "'";
      case TokenType::kString: return "a string";
      case TokenType::kInteger:
      case TokenType::kFloat: return "'" + t.value + "'";
      case TokenType::kOperator: return "'" + t.value + "'";
      case TokenType::kEnd: return "the end of the template";
    }
    return "?";
  }

  [[noreturn]] void fail(const Token& at, const std::string& message) const {
    SPECULA_CHECK(false, "template line {}, column {}: {}", at.line, at.column, message);
    std::abort();
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail(current(), "expected '" + std::string(op) + "', got " + describe(current()));
  }
  std::string expect_name(std::string_view what) {
    if (current().type != TokenType::kName) fail(current(), "expected " + std::string(what) + ", got " + describe(current()));
    return next().value;
  }
  void expect_block_end(std::string_view statement) {
    if (current().type != TokenType::kBlockEnd) {
      fail(current(), "expected '%}' to end '" + std::string(statement) + "', got " + describe(current()));
    }
    next();
  }

  static Location loc(const Token& t) { return {t.line, t.column}; }

  ExprPtr make(ExprKind kind, const Token& at, std::vector<ExprPtr> children = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->loc = loc(at);
    e->children = std::move(children);
    return e;
  }
  // Called on every finished node: bounds the tree depth (chains like a|f|f|f... or a+b+c+...
  // nest without recursing in the parser).
  ExprPtr finish(ExprPtr e) {
    int depth = 0;
    for (const auto& c : e->children) depth = std::max(depth, c ? c->depth : 0);
    for (const auto& [name, c] : e->keywords) depth = std::max(depth, c->depth);
    e->depth = depth + 1;
    if (e->depth > kMaxExpressionDepth) {
      SPECULA_CHECK(false, "template line {}, column {}: expression nested more than {} levels deep", e->loc.line,
                    e->loc.column, kMaxExpressionDepth);
    }
    return e;
  }

  // ---- statements ----

  // Parses until `{% <one of end_tags>` (consumed up to the tag name, which goes to *matched) or,
  // when end_tags is empty, the end of the template.
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string* matched = nullptr) {
    Body body;
    while (true) {
      const Token& t = current();
      if (t.type == TokenType::kEnd) {
        if (end_tags.size() == 0) return body;
        std::string expected;
        for (std::string_view tag : end_tags) expected += (expected.empty() ? "'" : " or '") + std::string(tag) + "'";
        fail(t, "unexpected end of template; expected " + expected + " to close the block at line " +
                    std::to_string(open_blocks_.empty() ? 0 : open_blocks_.back()));
      }
      if (t.type == TokenType::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->loc = loc(t);
        s->text = next().value;
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kVariableBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->loc = loc(next());
        s->expr = parse_tuple(true, {});
        if (current().type != TokenType::kVariableEnd) fail(current(), "expected '}}', got " + describe(current()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        const Token& tag = peek();
        if (tag.type != TokenType::kName) fail(tag, "expected a statement name after '{%', got " + describe(tag));
        if (std::find(end_tags.begin(), end_tags.end(), tag.value) != end_tags.end()) {
          next();
          const Token end_tag = next();
          if (matched != nullptr) *matched = end_tag.value;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    next();  // {%
    const Token tag = next();
    if (++nesting_ > kMaxStatementNesting) fail(tag, "statements nested more than " + std::to_string(kMaxStatementNesting) + " levels deep");
    open_blocks_.push_back(tag.line);
    auto s = std::make_unique<Stmt>();
    s->loc = loc(tag);
    const std::string& name = tag.value;
    if (name == "if") {
      parse_if(*s);
    } else if (name == "for") {
      parse_for(*s);
    } else if (name == "set") {
      parse_set(*s);
    } else if (name == "macro") {
      parse_macro(*s);
    } else if (name == "call") {
      parse_call_block(*s);
    } else if (name == "filter") {
      s->kind = StmtKind::kFilterBlock;
      s->expr = parse_filter_chain(make(ExprKind::kCaptured, tag), true);
      expect_block_end("filter");
      s->body = parse_body({"endfilter"});
      expect_block_end("endfilter");
    } else if (name == "with") {
      parse_with(*s);
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(tag, "'" + name + "' outside of a for loop");
      s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      expect_block_end(name);
    } else if (name == "generation") {
      // transformers' AssistantTracker extension: marks assistant text; renders its body as is.
      s->kind = StmtKind::kScope;
      expect_block_end(name);
      s->body = parse_body({"endgeneration"});
      expect_block_end("endgeneration");
    } else if (name == "include" || name == "import" || name == "from" || name == "extends" || name == "block" ||
               name == "autoescape" || name == "do" || name == "trans" || name == "print") {
      fail(tag, "'" + name + "' statements are not supported in chat templates");
    } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      fail(tag, "unexpected '" + name + "' (no open block expects it here)");
    } else {
      fail(tag, "unknown statement '" + name + "'");
    }
    open_blocks_.pop_back();
    --nesting_;
    return s;
  }

  void parse_if(Stmt& s) {
    s.kind = StmtKind::kIf;
    while (true) {
      s.conditions.push_back(parse_tuple(false, {}));
      expect_block_end("if");
      std::string tag;
      s.bodies.push_back(parse_body({"elif", "else", "endif"}, &tag));
      if (tag == "elif") continue;
      if (tag == "else") {
        expect_block_end("else");
        s.else_body = parse_body({"endif"});
      }
      expect_block_end("endif");
      return;
    }
  }

  void parse_for(Stmt& s) {
    s.kind = StmtKind::kFor;
    s.target = parse_target(false, "in");
    if (!skip_name("in")) fail(current(), "expected 'in' in for loop, got " + describe(current()));
    s.expr = parse_tuple(false, {"recursive"});
    if (skip_name("if")) s.condition = parse_expression(true);
    if (is_name(current(), "recursive")) fail(current(), "recursive for loops are not supported");
    expect_block_end("for");
    ++loop_depth_;
    std::string tag;
    s.body = parse_body({"else", "endfor"}, &tag);
    --loop_depth_;
    if (tag == "else") {
      expect_block_end("else");
      s.else_body = parse_body({"endfor"});
    }
    expect_block_end("endfor");
  }

  void parse_set(Stmt& s) {
    const Token at = current();
    s.target = parse_target(true, "=");
    if (skip_op("=")) {
      s.kind = StmtKind::kSet;
      s.expr = parse_tuple(true, {});
      expect_block_end("set");
      return;
    }
    if (s.target.unpack) fail(at, "a block set needs a single name");
    s.kind = StmtKind::kSetBlock;
    if (is_op(current(), "|")) s.expr = parse_filter_chain(make(ExprKind::kCaptured, at), false);
    expect_block_end("set");
    // A loop around the block set does not make break/continue inside it legal: the body is
    // rendered on its own.
    const int saved_loops = std::exchange(loop_depth_, 0);
    s.body = parse_body({"endset"});
    loop_depth_ = saved_loops;
    expect_block_end("endset");
  }

  // `name`, `a, b` (for unpacking) or, with_namespace, `ns.attr`.
  Target parse_target(bool with_namespace, std::string_view end_name) {
    Target target;
    const std::string first = expect_name("a variable name");
    if (with_namespace && skip_op(".")) {
      target.names.push_back(first);
      target.attr = expect_name("an attribute name");
      return target;
    }
    target.names.push_back(first);
    while (skip_op(",")) {
      target.unpack = true;
      if (is_name(current(), end_name) || is_op(current(), end_name)) break;
      target.names.push_back(expect_name("a variable name"));
    }
    return target;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(current(), ")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(current(), ")")) break;
      s.params.push_back(expect_name("a parameter name"));
      s.defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    next();
  }

  void parse_macro(Stmt& s) {
    s.kind = StmtKind::kMacro;
    s.text = expect_name("a macro name");
    parse_params(s);
    expect_block_end("macro");
    const int saved_loops = std::exchange(loop_depth_, 0);
    s.body = parse_body({"endmacro"});
    loop_depth_ = saved_loops;
    expect_block_end("endmacro");
  }

  void parse_call_block(Stmt& s) {
    s.kind = StmtKind::kCallBlock;
    if (is_op(current(), "(")) parse_params(s);
    s.expr = parse_expression(true);
    if (s.expr->kind != ExprKind::kCall) fail(current(), "expected a macro call after 'call'");
    expect_block_end("call");
    const int saved_loops = std::exchange(loop_depth_, 0);
    s.body = parse_body({"endcall"});
    loop_depth_ = saved_loops;
    expect_block_end("endcall");
  }

  void parse_with(Stmt& s) {
    s.kind = StmtKind::kWith;
    while (current().type != TokenType::kBlockEnd) {
      if (!s.params.empty()) expect_op(",");
      s.params.push_back(expect_name("a variable name"));
      expect_op("=");
      s.defaults.push_back(parse_expression(true));
    }
    expect_block_end("with");
    s.body = parse_body({"endwith"});
    expect_block_end("endwith");
  }

  // ---- expressions (jinja2's precedence, lowest first) ----

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser, const Token& at) : p(parser) {
      if (++p.expr_nesting_ > kMaxParseNesting) {
        p.fail(at, "parentheses, brackets or unary operators nested more than " + std::to_string(kMaxParseNesting) +
                       " levels deep");
      }
    }
    ~DepthGuard() { --p.expr_nesting_; }
  };

  // A comma-separated list becomes a tuple: `{{ a, b }}`, `{% set x = 1, 2 %}`.
  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> end_names,
                      bool explicit_parens = false) {
    const Token start = current();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      const Token& t = current();
      const bool at_end = t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd || is_op(t, ")") ||
                          (t.type == TokenType::kName &&
                           std::find(end_names.begin(), end_names.end(), t.value) != end_names.end());
      if (at_end) break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
      if (is_op(current(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(current(), "expected an expression, got " + describe(current()));
    }
    return finish(make(ExprKind::kTuple, start, std::move(items)));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this, current());
    ExprPtr expr = parse_or();
    if (!with_condexpr) return expr;
    while (is_name(current(), "if")) {
      const Token at = next();
      ExprPtr condition = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression(true) : nullptr;
      std::vector<ExprPtr> children;
      children.push_back(std::move(expr));
      children.push_back(std::move(condition));
      children.push_back(std::move(otherwise));
      expr = finish(make(ExprKind::kCondExpr, at, std::move(children)));
    }
    return expr;
  }

  ExprPtr binary(ExprKind kind, const Token& at, ExprPtr left, ExprPtr right, std::string name = {}) {
    std::vector<ExprPtr> children;
    children.push_back(std::move(left));
    children.push_back(std::move(right));
    ExprPtr e = make(kind, at, std::move(children));
    e->name = std::move(name);
    return finish(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name(current(), "or")) {
      const Token at = next();
      left = binary(ExprKind::kOr, at, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name(current(), "and")) {
      const Token at = next();
      left = binary(ExprKind::kAnd, at, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name(current(), "not")) {
      const Token at = next();
      DepthGuard guard(*this, at);
      std::vector<ExprPtr> children;
      children.push_back(parse_not());
      return finish(make(ExprKind::kNot, at, std::move(children)));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token start = current();
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    while (true) {
      const Token& t = current();
      std::string op;
      if (t.type == TokenType::kOperator &&
          (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" || t.value == ">" || t.value == ">=")) {
        op = next().value;
      } else if (is_name(t, "in")) {
        next();
        op = "in";
      } else if (is_name(t, "not") && is_name(peek(), "in")) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    ExprPtr e = make(ExprKind::kCompare, start);
    e->children.push_back(std::move(first));
    for (auto& operand : operands) e->children.push_back(std::move(operand));
    e->ops = std::move(ops);
    return finish(std::move(e));
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op(current(), "+") || is_op(current(), "-")) {
      const Token at = next();
      left = binary(ExprKind::kBinary, at, std::move(left), parse_concat(), at.value);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const Token start = current();
    ExprPtr first = parse_math2();
    if (!is_op(current(), "~")) return first;
    ExprPtr e = make(ExprKind::kConcat, start);
    e->children.push_back(std::move(first));
    while (skip_op("~")) e->children.push_back(parse_math2());
    return finish(std::move(e));
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op(current(), "*") || is_op(current(), "/") || is_op(current(), "//") || is_op(current(), "%")) {
      const Token at = next();
      left = binary(ExprKind::kBinary, at, std::move(left), parse_pow(), at.value);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op(current(), "**")) {
      const Token at = next();
      left = binary(ExprKind::kBinary, at, std::move(left), parse_unary(true), "**");
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Token at = current();
    ExprPtr node;
    if (is_op(at, "-") || is_op(at, "+")) {
      next();
      DepthGuard guard(*this, at);
      std::vector<ExprPtr> children;
      children.push_back(parse_unary(false));
      node = finish(make(at.value == "-" ? ExprKind::kNeg : ExprKind::kPos, at, std::move(children)));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = current();
    switch (t.type) {
      case TokenType::kName: {
        next();
        auto e = make(ExprKind::kLiteral, t);
        if (t.value == "true" || t.value == "True") {
          e->value = Value(true);
        } else if (t.value == "false" || t.value == "False") {
          e->value = Value(false);
        } else if (t.value == "none" || t.value == "None") {
          e->value = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.value;
        }
        return finish(std::move(e));
      }
      case TokenType::kString: {
        // Adjacent literals concatenate: "a" "b".
        std::string text = next().value;
        while (current().type == TokenType::kString) text += next().value;
        auto e = make(ExprKind::kLiteral, t);
        e->value = Value(std::move(text));
        return finish(std::move(e));
      }
      case TokenType::kInteger:
      case TokenType::kFloat: {
        next();
        auto e = make(ExprKind::kLiteral, t);
        e->value = t.type == TokenType::kInteger ? Value(t.int_value) : Value(t.float_value);
        return finish(std::move(e));
      }
      case TokenType::kOperator:
        if (t.value == "(") {
          next();
                    ExprPtr inner = parse_tuple(true, {}, true);
          expect_op(")");
          return inner;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail(t, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr parse_list() {
    const Token start = next();
        ExprPtr e = make(ExprKind::kList, start);
    while (!is_op(current(), "]")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op(current(), "]")) break;
      e->children.push_back(parse_expression(true));
    }
    next();
    return finish(std::move(e));
  }

  ExprPtr parse_dict() {
    const Token start = next();
        ExprPtr e = make(ExprKind::kDict, start);
    while (!is_op(current(), "}")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op(current(), "}")) break;
      e->children.push_back(parse_expression(true));
      expect_op(":");
      e->children.push_back(parse_expression(true));
    }
    next();
    return finish(std::move(e));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const Token t = current();
      if (is_op(t, ".")) {
        next();
        const Token attr = next();
        if (attr.type == TokenType::kName) {
          ExprPtr e = make(ExprKind::kGetAttr, t);
          e->children.push_back(std::move(node));
          e->name = attr.value;
          node = finish(std::move(e));
        } else if (attr.type == TokenType::kInteger) {
          ExprPtr index = make(ExprKind::kLiteral, attr);
          index->value = Value(attr.int_value);
          node = binary(ExprKind::kGetItem, t, std::move(node), finish(std::move(index)));
        } else {
          fail(attr, "expected an attribute name after '.', got " + describe(attr));
        }
      } else if (is_op(t, "[")) {
        next();
                node = parse_subscript(std::move(node), t);
        expect_op("]");
      } else if (is_op(t, "(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node, const Token& at) {
    std::vector<ExprPtr> parts;  // start, stop, step when slicing
    if (!is_op(current(), ":")) {
      ExprPtr index = parse_expression(true);
      if (!is_op(current(), ":")) {
        if (is_op(current(), ",")) fail(current(), "tuple subscripts are not supported");
        return binary(ExprKind::kGetItem, at, std::move(node), std::move(index));
      }
      parts.push_back(std::move(index));
    } else {
      parts.push_back(nullptr);
    }
    next();  // ':'
    const auto slice_part = [&]() -> ExprPtr {
      if (is_op(current(), "]") || is_op(current(), ":")) return nullptr;
      return parse_expression(true);
    };
    parts.push_back(slice_part());
    if (skip_op(":")) {
      parts.push_back(slice_part());
    } else {
      parts.push_back(nullptr);
    }
    ExprPtr e = make(ExprKind::kSlice, at);
    e->children.push_back(std::move(node));
    for (auto& p : parts) e->children.push_back(std::move(p));
    return finish(std::move(e));
  }

  // Arguments of a call, filter or test: positional, then name=value.
  void parse_call_args(Expr& e) {
    expect_op("(");
        bool first = true;
    while (!is_op(current(), ")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(current(), ")")) break;
      if (is_op(current(), "*") || is_op(current(), "**")) fail(current(), "*args and **kwargs in calls are not supported");
      if (current().type == TokenType::kName && is_op(peek(), "=")) {
        std::string key = next().value;
        next();
        e.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.keywords.empty()) fail(current(), "positional argument after a keyword argument");
        e.children.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr e = make(ExprKind::kCall, current());
    e->children.push_back(std::move(callee));
    parse_call_args(*e);
    return finish(std::move(e));
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op(current(), "|")) {
        node = parse_filter_chain(std::move(node), false);
      } else if (is_name(current(), "is")) {
        node = parse_test(std::move(node));
      } else if (is_op(current(), "(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // `| name[(args)]`, repeated; for `{% filter %}` (start_inline) the first '|' is implicit.
  ExprPtr parse_filter_chain(ExprPtr node, bool start_inline) {
    while (start_inline || is_op(current(), "|")) {
      if (!start_inline) next();
      start_inline = false;
      const Token at = current();
      std::string name = expect_name("a filter name");
      while (skip_op(".")) name.append(".").append(expect_name("a filter name"));
      ExprPtr e = make(ExprKind::kFilter, at);
      e->name = std::move(name);
      e->children.push_back(std::move(node));
      if (is_op(current(), "(")) parse_call_args(*e);
      node = finish(std::move(e));
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const Token at = next();  // 'is'
    const bool negated = skip_name("not");
    std::string name = expect_name("a test name");
    while (skip_op(".")) name.append(".").append(expect_name("a test name"));
    ExprPtr e = make(ExprKind::kTest, at);
    e->name = std::move(name);
    e->children.push_back(std::move(node));
    const Token& t = current();
    if (is_op(t, "(")) {
      parse_call_args(*e);
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString || t.type == TokenType::kInteger ||
                t.type == TokenType::kFloat || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
      // One argument without parentheses: `x is divisibleby 3`, `x is sameas false`.
      if (is_name(t, "is")) fail(t, "you cannot chain multiple tests with 'is'");
      e->children.push_back(parse_postfix(parse_primary()));
    }
    ExprPtr test = finish(std::move(e));
    if (!negated) return test;
    std::vector<ExprPtr> children;
    children.push_back(std::move(test));
    return finish(make(ExprKind::kNot, at, std::move(children)));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int expr_nesting_ = 0;
  int loop_depth_ = 0;
  std::vector<int> open_blocks_;
};

}  // namespace

Program parse_template(std::string_view source) { return Parser(tokenize(source)).run(); }

}  // namespace specula::jinja
