#include "colossus/data/chat/jinja/eval.h"

#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "colossus/data/chat/jinja/builtins.h"

namespace colossus::data::chat::jinja {
namespace {

[[noreturn]] void type_error(std::string_view op, const Value& a, const Value& b) {
  throw EvalError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
}

// a op b on 64-bit integers; Python's are unbounded, so overflow is an error.
template <typename Op>
int64_t checked(Op op, int64_t a, int64_t b) {
  int64_t result = 0;
  if (op(a, b, &result)) throw EvalError("integer overflow (chat templates use 64-bit integers)");
  return result;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return a.str() + b.str();
    if (a.is_list() && b.is_list()) {
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return out;
    }
    if (a.is_string() || a.is_list())
      throw EvalError(
          fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a)));
  }
  if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
    const Value& seq = a.is_int() ? b : a;
    const Value& times = a.is_int() ? a : b;
    if (!times.is_int() || !(seq.is_string() || seq.is_list())) type_error(op, a, b);
    std::string s;
    List l;
    for (int64_t i = 0; i < times.to_int(); ++i) {
      if (seq.is_string())
        s += seq.str();
      else
        l.insert(l.end(), seq.list().begin(), seq.list().end());
    }
    return seq.is_string() ? Value(s) : Value(l);
  }
  if (op == "%" && a.is_string()) throw EvalError("string formatting with '%' is not supported; use '~' or '+'");
  if (!a.is_number() || !b.is_number()) type_error(op, a, b);
  const bool ints = a.is_int() && b.is_int();
  if (ints && op != "/" && !(op == "**" && b.to_int() < 0)) {
    const int64_t x = a.to_int(), y = b.to_int();
    const auto add = [](int64_t p, int64_t q, int64_t* r) { return __builtin_add_overflow(p, q, r); };
    const auto sub = [](int64_t p, int64_t q, int64_t* r) { return __builtin_sub_overflow(p, q, r); };
    const auto mul = [](int64_t p, int64_t q, int64_t* r) { return __builtin_mul_overflow(p, q, r); };
    if (op == "+") return checked(add, x, y);
    if (op == "-") return checked(sub, x, y);
    if (op == "*") return checked(mul, x, y);
    if (op == "**") {
      int64_t result = 1, base = x;
      for (int64_t e = y; e > 0; e >>= 1) {  // by squaring
        if (e & 1) result = checked(mul, result, base);
        if (e > 1) base = checked(mul, base, base);
      }
      return result;
    }
    if (y == 0) throw EvalError("integer division or modulo by zero");
    const int64_t q = x / y, m = x % y;
    const bool adjust = m != 0 && ((m < 0) != (y < 0));  // Python floors
    return op == "//" ? q - (adjust ? 1 : 0) : m + (adjust ? y : 0);
  }
  const double x = a.to_double(), y = b.to_double();
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "**") return std::pow(x, y);
  if (y == 0) throw EvalError(op == "/" ? "division by zero" : "float modulo or floor division by zero");
  if (op == "/") return x / y;
  if (op == "//") return std::floor(x / y);
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return m;
}

class Renderer {
 public:
  explicit Renderer(const nlohmann::ordered_json& context) : globals_(make_globals()) {
    if (!context.is_object()) throw EvalError("the template context must be a JSON object");
    for (const auto& [key, value] : context.items()) root_.vars[key] = from_json(value);
  }

  // generation_spans: where to record {% generation %} output; null: not tracked.
  std::string run(const Body& body, std::vector<ByteSpan>* generation_spans) {
    std::string out;
    generation_spans_ = generation_spans;
    output_ = &out;
    exec(body, root_, out);
    return out;
  }

 private:
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    Frame* parent = nullptr;
  };
  enum class Flow { Normal, Break, Continue };

  Value lookup(const std::string& name, Frame& frame) const {
    for (const Frame* f = &frame; f; f = f->parent)
      if (const auto it = f->vars.find(name); it != f->vars.end()) return it->second;
    if (const Value* g = find_key(globals_, name)) return *g;
    return Undefined{fmt::format("'{}' is undefined", name)};
  }

  Flow exec(const Body& body, Frame& frame, std::string& out) {
    for (const StmtPtr& s : body) {
      const Flow flow = exec_stmt(*s, frame, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  void assign(const std::vector<std::string>& targets, const Value& value, Frame& frame, Pos pos) {
    if (targets.size() == 1) {
      frame.vars[targets[0]] = value;
      return;
    }
    if (!value.is_list() && !value.is_string())
      template_error(pos, fmt::format("cannot unpack a '{}' into {} names", type_name(value), targets.size()));
    const List items = iterate(value);
    if (items.size() != targets.size())
      template_error(pos, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t i = 0; i < items.size(); ++i) frame.vars[targets[i]] = items[i];
  }

  Flow exec_stmt(const Stmt& s, Frame& frame, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text:
        out += s.text;
        break;
      case Stmt::Kind::Output:
        out += to_str(eval(*s.expr, frame));
        break;
      case Stmt::Kind::If:
        for (const auto& [condition, body] : s.branches)
          if (!condition || truthy(eval(*condition, frame))) return exec(body, frame, out);
        break;
      case Stmt::Kind::For:
        return exec_for(s, frame, out);
      case Stmt::Kind::Set: {
        const Value value = eval(*s.expr, frame);
        if (s.attribute.empty()) {
          assign(s.targets, value, frame, s.pos);
          break;
        }
        const Value target = lookup(s.targets[0], frame);
        if (!target.is<std::shared_ptr<Namespace>>())
          template_error(s.pos, fmt::format("cannot set '{}.{}': '{}' is a {}, not a namespace()", s.targets[0],
                                            s.attribute, s.targets[0], type_name(target)));
        Dict& attrs = target.as<std::shared_ptr<Namespace>>()->attrs;
        if (!s.attribute.empty() && s.attribute[0] == '_')
          template_error(s.pos, fmt::format("namespace attributes cannot start with '_', got '{}'", s.attribute));
        for (auto& [key, old] : attrs)
          if (key == s.attribute) return (old = value, Flow::Normal);
        attrs.emplace_back(s.attribute, value);
        break;
      }
      case Stmt::Kind::SetBlock: {
        std::string captured;
        exec(s.body, frame, captured);
        frame.vars[s.targets[0]] = std::move(captured);
        break;
      }
      case Stmt::Kind::Macro:
        frame.vars[s.text] = make_macro(s);
        break;
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
      case Stmt::Kind::Generation: {
        if (!generation_spans_) return exec(s.body, frame, out);
        if (&out != output_)
          template_error(s.pos, "a {% generation %} block inside a macro or a set block has no place in the output, "
                                "so its assistant tokens cannot be marked");
        const size_t begin = out.size();
        const Flow flow = exec(s.body, frame, out);
        generation_spans_->emplace_back(begin, out.size());
        return flow;
      }
    }
    return Flow::Normal;
  }

  Flow exec_for(const Stmt& s, Frame& frame, std::string& out) {
    const Value iterable = eval(*s.expr, frame);
    List items;
    try {
      items = iterate(iterable);
    } catch (const EvalError& e) {
      template_error(s.expr->pos, e.what());
    }
    if (s.condition) {  // `for x in xs if c`: filtered before the loop, so loop.length counts what is kept
      List kept;
      for (Value& item : items) {
        Frame scope{.parent = &frame};
        assign(s.targets, item, scope, s.pos);
        if (truthy(eval(*s.condition, scope))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto shared = std::make_shared<const List>(std::move(items));
    for (size_t i = 0; i < shared->size(); ++i) {
      Frame scope{.parent = &frame};  // fresh per iteration, as Jinja's loop body scope
      assign(s.targets, (*shared)[i], scope, s.pos);
      scope.vars["loop"] = std::make_shared<const LoopInfo>(LoopInfo{static_cast<int64_t>(i), shared});
      if (exec(s.body, scope, out) == Flow::Break) break;
    }
    if (shared->empty() && !s.else_body.empty()) {
      Frame scope{.parent = &frame};
      exec(s.else_body, scope, out);
    }
    return Flow::Normal;
  }

  // A macro renders its body in a scope of its own over the template's top
  // level, with the call's arguments bound to its parameters.
  std::shared_ptr<const Callable> make_macro(const Stmt& macro) {
    return std::make_shared<const Callable>(Callable{
        macro.text, [this, &macro](const CallArgs& args) -> Value {
          if (++macro_depth_ > 100)
            throw EvalError(fmt::format("macro '{}' recursed more than 100 levels", macro.text));
          Frame scope{.parent = &root_};
          if (args.positional.size() > macro.params.size())
            throw EvalError(fmt::format("macro '{}' takes {} arguments ({} given)", macro.text, macro.params.size(),
                                        args.positional.size()));
          for (size_t i = 0; i < macro.params.size(); ++i) {
            const auto& [name, fallback] = macro.params[i];
            const Value* keyword = nullptr;
            for (const auto& [k, v] : args.keyword)
              if (k == name) keyword = &v;
            if (i < args.positional.size())
              scope.vars[name] = args.positional[i];
            else if (keyword)
              scope.vars[name] = *keyword;
            else if (fallback)
              scope.vars[name] = eval(*fallback, scope);
            else
              scope.vars[name] = Undefined{fmt::format("parameter '{}' of macro '{}' was not given", name, macro.text)};
          }
          for (const auto& [k, v] : args.keyword) {
            bool known = false;
            for (const auto& param : macro.params) known = known || param.first == k;
            if (!known) throw EvalError(fmt::format("macro '{}' has no parameter '{}'", macro.text, k));
          }
          std::string out;
          exec(macro.body, scope, out);
          --macro_depth_;
          return out;
        }});
  }

  // Runs eval_node, giving an EvalError the position of the innermost
  // expression that raised it.
  Value eval(const Expr& e, Frame& frame) {
    try {
      return eval_node(e, frame);
    } catch (const EvalError& error) {
      template_error(e.pos, error.what());
    }
  }

  CallArgs eval_args(const Expr& e, Frame& frame, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], frame));
    for (const auto& [key, value] : e.kwargs) args.keyword.emplace_back(key, eval(*value, frame));
    return args;
  }

  Value eval_node(const Expr& e, Frame& frame) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.literal;
      case Expr::Kind::Name:
        return lookup(e.name, frame);
      case Expr::Kind::List: {
        List items;
        for (const ExprPtr& item : e.args) items.push_back(eval(*item, frame));
        return items;
      }
      case Expr::Kind::Dict: {
        Dict dict;
        for (size_t i = 0; i < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i], frame);
          if (!key.is_string())
            template_error(e.args[i]->pos, fmt::format("dict keys must be strings, got {}", repr(key)));
          const Value value = eval(*e.args[i + 1], frame);
          bool replaced = false;
          for (auto& [k, v] : dict)
            if (k == key.str()) replaced = (v = value, true);
          if (!replaced) dict.emplace_back(key.str(), value);
        }
        return dict;
      }
      case Expr::Kind::Attr: {
        const Value obj = eval(*e.args[0], frame);
        require_defined(obj);
        return get_attr(obj, e.name);
      }
      case Expr::Kind::Item: {
        const Value obj = eval(*e.args[0], frame);
        const Value key = eval(*e.args[1], frame);
        require_defined(obj);
        return get_item(obj, key);
      }
      case Expr::Kind::Slice: {
        const Value obj = eval(*e.args[0], frame);
        Value parts[3] = {None{}, None{}, None{}};
        for (int k = 0; k < 3; ++k)
          if (e.args[k + 1]) parts[k] = eval(*e.args[k + 1], frame);
        require_defined(obj);
        return get_slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::Call:
        return eval_call(e, frame);
      case Expr::Kind::Filter: {
        const Value input = eval(*e.args[0], frame);
        return apply_filter(e.name, input, eval_args(e, frame, 1));
      }
      case Expr::Kind::Test: {
        const Value input = eval(*e.args[0], frame);
        return apply_test(e.name, input, eval_args(e, frame, 1)) != e.negated;
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.args[0], frame);
        if (e.name == "not") return !truthy(v);
        require_defined(v);
        if (v.is<double>()) return e.name == "-" ? -v.as<double>() : v.as<double>();
        if (!v.is_int()) throw EvalError(fmt::format("bad operand type for unary {}: '{}'", e.name, type_name(v)));
        if (e.name == "+") return v.to_int();
        return checked([](int64_t p, int64_t q, int64_t* r) { return __builtin_sub_overflow(p, q, r); }, 0, v.to_int());
      }
      case Expr::Kind::Binary: {
        const Value left = eval(*e.args[0], frame);
        if (e.name == "and") return truthy(left) ? eval(*e.args[1], frame) : left;
        if (e.name == "or") return truthy(left) ? left : eval(*e.args[1], frame);
        const Value right = eval(*e.args[1], frame);
        if (e.name == "~") return to_str(left) + to_str(right);
        return arithmetic(e.name, left, right);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.args[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], frame);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==")
            ok = equals(left, right);
          else if (op == "!=")
            ok = !equals(left, right);
          else if (op == "in" || op == "notin")
            ok = contains(right, left) == (op == "in");
          else {
            const int c = compare(left, right, op);
            ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!ok) return false;
          left = std::move(right);
        }
        return true;
      }
      case Expr::Kind::Cond:
        if (truthy(eval(*e.args[0], frame))) return eval(*e.args[1], frame);
        return e.args[2] ? eval(*e.args[2], frame) : Value(Undefined{"the 'if' expression had no 'else'"});
    }
    throw EvalError("unknown expression");
  }

  Value eval_call(const Expr& e, Frame& frame) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::Attr) {  // obj.method(...)
      const Value obj = eval(*callee.args[0], frame);
      require_defined(obj);
      const CallArgs args = eval_args(e, frame, 1);
      if (auto result = call_method(obj, callee.name, args)) return *result;
      const Value fn = get_attr(obj, callee.name);
      if (fn.is<std::shared_ptr<const Callable>>()) return fn.as<std::shared_ptr<const Callable>>()->call(args);
      throw EvalError(fmt::format("'{}' object has no method '{}'", type_name(obj), callee.name));
    }
    const Value fn = eval(callee, frame);
    if (fn.is_undefined() && callee.kind == Expr::Kind::Name)
      throw EvalError(fmt::format("unknown function '{}'", callee.name));
    require_defined(fn);
    if (!fn.is<std::shared_ptr<const Callable>>())
      throw EvalError(fmt::format("'{}' object is not callable", type_name(fn)));
    return fn.as<std::shared_ptr<const Callable>>()->call(eval_args(e, frame, 1));
  }

  Dict globals_;
  Frame root_;
  int macro_depth_ = 0;
  std::vector<ByteSpan>* generation_spans_ = nullptr;
  const std::string* output_ = nullptr;  // the template's own output, not a capture
};

bool has_generation_in(const Body& body) {
  for (const StmtPtr& s : body) {
    if (s->kind == Stmt::Kind::Generation || has_generation_in(s->body) || has_generation_in(s->else_body))
      return true;
    for (const auto& branch : s->branches)
      if (has_generation_in(branch.second)) return true;
  }
  return false;
}

}  // namespace

std::string render(const Body& program, const nlohmann::ordered_json& context) {
  return Renderer(context).run(program, nullptr);
}

std::string render(const Body& program, const nlohmann::ordered_json& context, std::vector<ByteSpan>& generation_spans) {
  generation_spans.clear();
  return Renderer(context).run(program, &generation_spans);
}

bool has_generation_block(const Body& program) { return has_generation_in(program); }

}  // namespace colossus::data::chat::jinja
