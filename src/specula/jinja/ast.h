// The syntax tree the parser builds and the interpreter walks. One generic node type per
// category (expression, statement) keeps the tree small and the parser/interpreter symmetric;
// the comment on each kind says which fields it uses.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "specula/jinja/value.h"

namespace specula::jinja {

struct Location {
  int line = 0;
  int column = 0;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,   // value
  kName,      // name
  kList,      // children: items
  kTuple,     // children: items
  kDict,      // children: key0, value0, key1, value1, ...
  kGetAttr,   // children[0].name
  kGetItem,   // children[0][children[1]]
  kSlice,     // children[0][children[1]:children[2]:children[3]] (null when absent)
  kCall,      // children[0](children[1:], keywords)
  kFilter,    // children[0] | name(children[1:], keywords)
  kTest,      // children[0] is name(children[1:], keywords)
  kNeg,       // -children[0]
  kPos,       // +children[0]
  kNot,       // not children[0]
  kAnd,       // children[0] and children[1]
  kOr,        // children[0] or children[1]
  kBinary,    // children[0] <name> children[1], name in + - * / // % **
  kConcat,    // children joined with ~
  kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ... (chained like Python)
  kCondExpr,  // children[0] if children[1] else children[2] (null: undefined)
  kCaptured,  // the text a {% filter %} or block {% set %} captured (the interpreter supplies it)
};

struct Expr {
  ExprKind kind;
  Location loc;
  int depth = 1;  // 1 + the deepest child; bounded by the parser
  Value value;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// An assignment target: `x`, `a, b` (unpacking) or `ns.attr` (namespace attribute).
struct Target {
  std::vector<std::string> names;
  bool unpack = false;  // `a, b` (also `a,`)
  std::string attr;     // non-empty: names[0].attr
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // conditions[i] -> bodies[i]; else_body
  kFor,          // for target in expr [if condition] body [else else_body]
  kSet,          // set target = expr
  kSetBlock,     // set target [| filters] body endset (filters: a kFilter chain over kCaptured, or null)
  kMacro,        // macro name(params = defaults) body
  kCallBlock,    // call[(params)] expr body endcall: expr is the macro call, body becomes caller()
  kFilterBlock,  // filter <chain> body endfilter (expr: a kFilter chain over kCaptured)
  kWith,         // with targets[i] = values[i] body endwith
  kBreak,
  kContinue,
  kScope,        // {% generation %} body {% endgeneration %}: rendered as is
};

struct Stmt {
  StmtKind kind;
  Location loc;
  std::string text;  // kText; kMacro: name
  ExprPtr expr;      // kOutput, kFor (iterable), kSet, kCallBlock, kFilterBlock, kSetBlock (filters)
  ExprPtr condition; // kFor: the inline `if` filter
  Target target;     // kFor, kSet, kSetBlock
  std::vector<ExprPtr> conditions;  // kIf
  std::vector<Body> bodies;         // kIf
  Body body;
  Body else_body;
  std::vector<std::string> params;  // kMacro, kCallBlock, kWith (names)
  std::vector<ExprPtr> defaults;    // kMacro, kCallBlock (null: no default); kWith: values
};

struct Program {
  Body body;
};

}  // namespace specula::jinja
