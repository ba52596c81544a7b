// The parsed form of a chat template: expressions and statements as plain
// tagged nodes (one struct each, the fields a kind uses are listed beside it).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "colossus/data/chat/jinja/lexer.h"
#include "colossus/data/chat/jinja/value.h"

namespace colossus::data::chat::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // literal
    Name,     // name
    List,     // args: the items (also tuples)
    Dict,     // args: key, value, key, value, ...
    Attr,     // args[0] . name
    Item,     // args[0] [ args[1] ]
    Slice,    // args[0] [ args[1] : args[2] : args[3] ], a missing part is null
    Call,     // args[0] ( args[1..], kwargs )
    Filter,   // args[0] | name ( args[1..], kwargs )
    Test,     // args[0] is [not: negated] name ( args[1..], kwargs )
    Unary,    // name ("-", "+", "not") args[0]
    Binary,   // args[0] name args[1]; name is + - * / // % ** ~ and or
    Compare,  // args[0] ops[0] args[1] ops[1] args[2] ...; ops are == != < <= > >= in notin
    Cond,     // args[1] if args[0] else args[2] (null: undefined)
  };
  Kind kind;
  Pos pos;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches: (condition, body); the else branch has a null condition
    For,       // for targets in expr [if condition]: body [else: else_body]
    Set,       // set targets = expr; with attribute: set targets[0].attribute = expr
    SetBlock,  // set targets[0]: body rendered to a string
    Macro,     // macro text(params): body
    Break,
    Continue,
    Generation,  // transformers' {% generation %}: renders its body
  };
  Kind kind;
  Pos pos;
  std::string text;
  ExprPtr expr;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<std::pair<ExprPtr, Body>> branches;
  ExprPtr condition;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // a null default: required
};

}  // namespace colossus::data::chat::jinja
