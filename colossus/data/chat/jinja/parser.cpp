#include "colossus/data/chat/jinja/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "colossus/data/chat/jinja/builtins.h"

namespace colossus::data::chat::jinja {
namespace {

ExprPtr node(Expr::Kind kind, Pos pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, Pos pos) {
  auto e = node(Expr::Kind::Binary, pos);
  e->name = std::move(op);
  e->args.push_back(std::move(left));
  e->args.push_back(std::move(right));
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() { return parse_body({}, "", {}); }

 private:
  using Names = std::initializer_list<std::string_view>;

  const Token& cur() const { return t_[i_]; }
  const Token& peek() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(std::string_view op) const { return cur().kind == TokenKind::Op && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().kind == TokenKind::Name && cur().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::End:
        return "the end of the template";
      case TokenKind::BlockEnd:
        return "the end of the tag '%}'";
      case TokenKind::VarEnd:
        return "the end of the expression '}}'";
      case TokenKind::String:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void fail_expected(std::string_view what) const {
    template_error(cur().pos, fmt::format("expected {}, got {}", what, describe(cur())));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_expected(fmt::format("'{}'", op));
  }
  std::string expect_name(std::string_view what) {
    if (cur().kind != TokenKind::Name) fail_expected(what);
    std::string name = cur().text;
    next();
    return name;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::BlockEnd) fail_expected("'%}'");
    next();
  }

  // Statements up to a `{% NAME %}` with NAME in `ends`, left as the current
  // token; at top level (`ends` empty) up to the end of the template.
  Body parse_body(Names ends, std::string_view opener, Pos opener_pos) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::End) {
        if (ends.size() == 0) return body;
        template_error(opener_pos, fmt::format("'{{% {} %}}' is never closed: expected '{{% {} %}}' before the end "
                                               "of the template",
                                               opener, *std::prev(ends.end())));
      }
      if (t.kind == TokenKind::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == TokenKind::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->pos = t.pos;
        next();
        s->expr = parse_tuple(true, false);
        if (cur().kind != TokenKind::VarEnd) fail_expected("'}}'");
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::BlockBegin) {
        const Pos tag_pos = t.pos;
        next();
        if (cur().kind == TokenKind::Name && std::find(ends.begin(), ends.end(), cur().text) != ends.end()) return body;
        body.push_back(parse_statement(tag_pos, ends, opener, opener_pos));
      } else {
        fail_expected("text or a tag");
      }
    }
  }

  // After `{%` (at `pos`): one statement, its body and its end tag.
  StmtPtr parse_statement(Pos pos, Names ends, std::string_view opener, Pos opener_pos) {
    const Pos name_pos = cur().pos;
    const std::string tag = expect_name("a tag name");
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    if (tag == "if") {
      s->kind = Stmt::Kind::If;
      ExprPtr condition = parse_expression(false);
      while (true) {
        expect_block_end();
        Body body = parse_body({"elif", "else", "endif"}, "if", pos);
        s->branches.emplace_back(std::move(condition), std::move(body));
        if (skip_name("endif")) break;
        if (skip_name("else")) {
          expect_block_end();
          s->branches.emplace_back(nullptr, parse_body({"endif"}, "if", pos));
          next();
          break;
        }
        next();  // elif
        condition = parse_expression(false);
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::For;
      s->targets = parse_targets();
      if (!skip_name("in")) fail_expected("'in'");
      s->expr = parse_tuple(false, false);
      if (skip_name("if")) s->condition = parse_expression(true);
      if (is_name("recursive")) template_error(cur().pos, "recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"else", "endfor"}, "for", pos);
      --loop_depth_;
      if (skip_name("else")) {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, "for", pos);
      }
      next();
    } else if (tag == "set") {
      s->targets = parse_targets();
      if (s->targets.size() == 1 && skip_op(".")) s->attribute = expect_name("an attribute name");
      if (skip_op("=")) {
        s->kind = Stmt::Kind::Set;
        s->expr = parse_tuple(true, false);
      } else {
        if (s->targets.size() != 1 || !s->attribute.empty()) fail_expected("'='");
        s->kind = Stmt::Kind::SetBlock;
        expect_block_end();
        s->body = parse_body({"endset"}, "set", pos);
        next();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name("a macro name");
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (skip_op(")")) break;
        std::string name = expect_name("a parameter name");
        s->params.emplace_back(std::move(name), skip_op("=") ? parse_expression(true) : nullptr);
      }
      expect_block_end();
      const int saved_depth = std::exchange(loop_depth_, 0);
      s->body = parse_body({"endmacro"}, "macro", pos);
      loop_depth_ = saved_depth;
      next();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) template_error(pos, fmt::format("'{{% {} %}}' outside a for loop", tag));
      s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
    } else if (tag == "generation") {
      s->kind = Stmt::Kind::Generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, "generation", pos);
      next();
    } else {
      std::string message = fmt::format("unknown tag '{}'", tag);
      if (ends.size() > 0) {
        std::string expected;
        for (std::string_view e : ends) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
        message =
            fmt::format("unexpected '{}': expected {} for the '{}' at line {}", tag, expected, opener, opener_pos.line);
      }
      template_error(name_pos, message);
    }
    expect_block_end();
    return s;
  }

  // `x`, `k, v`, `(k, v)`: names to bind in for and set.
  std::vector<std::string> parse_targets() {
    const bool parens = skip_op("(");
    std::vector<std::string> names{expect_name("a variable name")};
    while (skip_op(",")) names.push_back(expect_name("a variable name"));
    if (parens) expect_op(")");
    return names;
  }

  bool at_tuple_end() const {
    return cur().kind == TokenKind::VarEnd || cur().kind == TokenKind::BlockEnd || is_op(")");
  }

  // `a` or `a, b, ...` (a tuple, kept as a list).
  ExprPtr parse_tuple(bool with_cond, bool explicit_parens) {
    const Pos pos = cur().pos;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (at_tuple_end()) break;
      items.push_back(parse_expression(with_cond));
    }
    if (!comma) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail_expected("an expression");
    }
    auto e = node(Expr::Kind::List, pos);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_cond) { return with_cond ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto cond = node(Expr::Kind::Cond, cur().pos);
      next();
      cond->args.push_back(parse_or());
      cond->args.push_back(std::move(e));
      cond->args.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      e = std::move(cond);
    }
    return e;
  }

  // One left-associative level: next_level (op next_level)*, where op is a
  // keyword (or, and) or an operator token.
  template <typename Next>
  ExprPtr parse_left_assoc(std::initializer_list<std::string_view> ops, bool keyword, Next next_level) {
    ExprPtr e = next_level();
    while (cur().kind == (keyword ? TokenKind::Name : TokenKind::Op) &&
           std::find(ops.begin(), ops.end(), cur().text) != ops.end()) {
      const Token op = cur();
      next();
      e = binary(op.text, std::move(e), next_level(), op.pos);
    }
    return e;
  }
  ExprPtr parse_or() {
    return parse_left_assoc({"or"}, true, [this] { return parse_and(); });
  }
  ExprPtr parse_and() {
    return parse_left_assoc({"and"}, true, [this] { return parse_not(); });
  }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    auto e = node(Expr::Kind::Unary, cur().pos);
    next();
    e->name = "not";
    e->args.push_back(parse_not());
    return e;
  }

  ExprPtr parse_compare() {
    const Pos pos = cur().pos;
    ExprPtr first = parse_math1();
    auto e = node(Expr::Kind::Compare, pos);
    e->args.push_back(std::move(first));
    while (true) {
      if (cur().kind == TokenKind::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                          cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        e->ops.push_back(cur().text);
        next();
      } else if (is_name("in")) {
        e->ops.push_back("in");
        next();
      } else if (is_name("not") && peek().kind == TokenKind::Name && peek().text == "in") {
        e->ops.push_back("notin");
        next();
        next();
      } else {
        break;
      }
      e->args.push_back(parse_math1());
    }
    return e->ops.empty() ? std::move(e->args[0]) : std::move(e);
  }

  ExprPtr parse_math1() {
    return parse_left_assoc({"+", "-"}, false, [this] { return parse_concat(); });
  }
  ExprPtr parse_concat() {
    return parse_left_assoc({"~"}, false, [this] { return parse_math2(); });
  }
  ExprPtr parse_math2() {
    return parse_left_assoc({"*", "/", "//", "%"}, false, [this] { return parse_pow(); });
  }
  ExprPtr parse_pow() {
    return parse_left_assoc({"**"}, false, [this] { return parse_unary(true); });
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(Expr::Kind::Unary, cur().pos);
      e->name = cur().text;
      next();
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    auto e = node(Expr::Kind::Literal, t.pos);
    if (t.kind == TokenKind::Name) {
      if (t.text == "true" || t.text == "True")
        e->literal = true;
      else if (t.text == "false" || t.text == "False")
        e->literal = false;
      else if (t.text == "none" || t.text == "None")
        e->literal = None{};
      else {
        e->kind = Expr::Kind::Name;
        e->name = t.text;
      }
      next();
    } else if (t.kind == TokenKind::String) {
      std::string s;
      while (cur().kind == TokenKind::String) {  // 'a' 'b' is 'ab', as in Python
        s += cur().text;
        next();
      }
      e->literal = std::move(s);
    } else if (t.kind == TokenKind::Int) {
      e->literal = t.int_value;
      next();
    } else if (t.kind == TokenKind::Float) {
      e->literal = t.float_value;
      next();
    } else if (skip_op("(")) {
      e = parse_tuple(true, true);
      expect_op(")");
    } else if (skip_op("[")) {
      e->kind = Expr::Kind::List;
      while (!skip_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
    } else if (skip_op("{")) {
      e->kind = Expr::Kind::Dict;
      while (!skip_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
    } else {
      fail_expected("an expression");
    }
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Pos pos = cur().pos;
      if (skip_op(".")) {
        if (cur().kind == TokenKind::Int) {
          auto item = node(Expr::Kind::Item, pos);
          auto index = node(Expr::Kind::Literal, cur().pos);
          index->literal = cur().int_value;
          next();
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(index));
          e = std::move(item);
        } else {
          auto attr = node(Expr::Kind::Attr, pos);
          attr->name = expect_name("an attribute name");
          attr->args.push_back(std::move(e));
          e = std::move(attr);
        }
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), pos);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::Call, "", pos);
      } else {
        return e;
      }
    }
  }

  // After `[`: an index, or a slice with any of its three parts missing.
  ExprPtr parse_subscript(ExprPtr object, Pos pos) {
    ExprPtr parts[3];
    bool is_slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expression(true);
      if (k == 2 || !skip_op(":")) break;
      is_slice = true;
    }
    expect_op("]");
    auto e = node(is_slice ? Expr::Kind::Slice : Expr::Kind::Item, pos);
    e->args.push_back(std::move(object));
    if (!is_slice && !parts[0]) template_error(pos, "empty subscript '[]'");
    for (int k = 0; k < (is_slice ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
    return e;
  }

  ExprPtr parse_call(ExprPtr callee, Expr::Kind kind, std::string name, Pos pos) {
    auto e = node(kind, pos);
    e->name = std::move(name);
    e->args.push_back(std::move(callee));
    if (!skip_op("(")) return e;
    while (!skip_op(")")) {
      if (e->args.size() > 1 || !e->kwargs.empty()) expect_op(",");
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**")) template_error(cur().pos, "*args and **kwargs in calls are not supported");
      if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Op && peek().text == "=") {
        std::string key = cur().text;
        next();
        next();
        e->kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e->kwargs.empty()) template_error(cur().pos, "positional argument after a keyword argument");
        e->args.push_back(parse_expression(true));
      }
    }
    return e;
  }

  std::string parse_dotted_name(std::string_view what) {
    std::string name = expect_name(what);
    while (skip_op(".")) name += "." + expect_name(what);
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      const Pos pos = cur().pos;
      if (skip_op("|")) {
        const Pos name_pos = cur().pos;
        std::string name = parse_dotted_name("a filter name");
        if (!has_filter(name))
          template_error(name_pos, fmt::format("unknown filter '{}' (known: {})", name, filter_names()));
        e = parse_call(std::move(e), Expr::Kind::Filter, std::move(name), pos);
      } else if (skip_name("is")) {
        const bool negated = skip_name("not");
        const Pos name_pos = cur().pos;
        std::string name = parse_dotted_name("a test name");
        if (!has_test(name)) template_error(name_pos, fmt::format("unknown test '{}' (known: {})", name, test_names()));
        e = parse_call(std::move(e), Expr::Kind::Test, std::move(name), pos);
        e->negated = negated;
        // `x is divisibleby 3`: one argument without parentheses.
        const TokenKind k = cur().kind;
        const bool starts_primary = k == TokenKind::Name || k == TokenKind::String || k == TokenKind::Int ||
                                    k == TokenKind::Float || is_op("[") || is_op("{");
        if (e->args.size() == 1 && e->kwargs.empty() && starts_primary && !is_name("else") && !is_name("or") &&
            !is_name("and")) {
          if (is_name("is")) template_error(cur().pos, "tests cannot be chained with 'is'");
          e->args.push_back(parse_postfix(parse_primary()));
        }
      } else if (is_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::Call, "", pos);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).parse_template(); }

}  // namespace colossus::data::chat::jinja
