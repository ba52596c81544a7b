// Filters, tests and globals with Jinja 3.1's (and transformers') argument
// names and defaults, so keyword calls like tojson(indent=2) or
// default('x', true) bind as in Python.
#include "colossus/data/chat/jinja/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "colossus/data/chat/chat_template.h"
#include "colossus/data/chat/jinja/strings.h"

namespace colossus::data::chat::jinja {
namespace {

using Filter = Value (*)(const Value&, const CallArgs&);
using Test = bool (*)(const Value&, const CallArgs&);

Value length_of(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return static_cast<int64_t>(utf8_length(v.str()));
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().size());
  throw EvalError(fmt::format("object of type '{}' has no len()", type_name(v)));
}

// A dotted attribute path as map/selectattr/join take it: 'function.name', 'items.0'.
Value attr_path(Value v, const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string part = path.substr(start, dot - start);
    if (v.is_undefined()) return v;
    const bool numeric =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = numeric ? get_item(v, static_cast<int64_t>(std::stoll(part))) : get_item(v, part);
    start = dot + 1;
  }
  return v;
}

CallArgs tail(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

std::string required_name(const CallArgs& args, std::string_view filter) {
  if (args.positional.empty() || !args.positional[0].is_string())
    throw EvalError(fmt::format("{}() needs a name as its first argument", filter));
  return args.positional[0].str();
}

// select / reject / selectattr / rejectattr: items whose test (or truth) is `keep`.
Value select(const Value& in, const CallArgs& args, bool by_attr, bool keep, std::string_view filter) {
  const std::string attr = by_attr ? required_name(args, filter) : "";
  const size_t test_at = by_attr ? 1 : 0;
  const bool with_test = args.positional.size() > test_at;
  const std::string test = with_test ? to_str(args.positional[test_at]) : "";
  if (with_test && !has_test(test)) throw EvalError(fmt::format("{}(): unknown test '{}'", filter, test));
  const CallArgs test_args = tail(args, test_at + 1);
  List out;
  for (const Value& item : iterate(in)) {
    const Value subject = by_attr ? attr_path(item, attr) : item;
    if ((with_test ? apply_test(test, subject, test_args) : truthy(subject)) == keep) out.push_back(item);
  }
  return out;
}

Value do_int(const Value& in, const CallArgs& args) {
  const auto a = bind("int", args, {{"default", Value(0)}, {"base", Value(10)}});
  if (in.is<bool>() || in.is<int64_t>()) return in.to_int();
  if (in.is<double>() && std::isfinite(in.as<double>())) return static_cast<int64_t>(std::trunc(in.as<double>()));
  if (in.is_string()) {
    if (auto i = parse_py_int(in.str(), static_cast<int>(a[1].to_int()))) return *i;
    if (auto d = parse_py_float(in.str()); d && std::isfinite(*d)) return static_cast<int64_t>(std::trunc(*d));
  }
  return a[0];
}

Value do_float(const Value& in, const CallArgs& args) {
  const auto a = bind("float", args, {{"default", Value(0.0)}});
  if (in.is_number()) return in.to_double();
  if (in.is_string())
    if (auto d = parse_py_float(in.str())) return *d;
  return a[0];
}

Value do_default(const Value& in, const CallArgs& args) {
  const auto a = bind("default", args, {{"default_value", Value("")}, {"boolean", Value(false)}});
  return in.is_undefined() || (truthy(a[1]) && !truthy(in)) ? a[0] : in;
}

Value do_tojson(const Value& in, const CallArgs& args) {
  const auto a = bind("tojson", args,
                      {{"ensure_ascii", Value(false)},
                       {"indent", Value(None{})},
                       {"separators", Value(None{})},
                       {"sort_keys", Value(false)}});
  JsonStyle style{.sort_keys = truthy(a[3]), .ensure_ascii = truthy(a[0])};
  if (a[1].is_int())
    style.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, a[1].to_int())), ' ');
  else if (a[1].is_string())
    style.indent = a[1].str();
  if (style.indent) style.item_separator = ",";
  if (a[2].is_list() && a[2].list().size() == 2 && a[2].list()[0].is_string() && a[2].list()[1].is_string()) {
    style.item_separator = a[2].list()[0].str();
    style.key_separator = a[2].list()[1].str();
  }
  return to_json(in, style);
}

// Jinja's indent: every line after the first (and the first with first=True)
// gets the indentation; blank lines only with blank=True.
Value do_indent(const Value& in, const CallArgs& args) {
  const auto a = bind("indent", args, {{"width", Value(4)}, {"first", Value(false)}, {"blank", Value(false)}});
  const std::string pad = a[0].is_string() ? a[0].str() : std::string(static_cast<size_t>(a[0].to_int()), ' ');
  const std::vector<std::string> lines = split_lines(to_str(in) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + ((truthy(a[2]) || !lines[i].empty()) ? pad : "");
    out += lines[i];
  }
  return truthy(a[1]) ? pad + out : out;
}

const std::map<std::string_view, Filter>& filters() {
  static const std::map<std::string_view, Filter> table = {
      {"abs",
       [](const Value& in, const CallArgs&) -> Value {
         require_defined(in);
         if (in.is<double>()) return std::fabs(in.as<double>());
         if (in.is_int()) return std::abs(in.to_int());
         throw EvalError(fmt::format("bad operand type for abs(): '{}'", type_name(in)));
       }},
      {"capitalize", [](const Value& in, const CallArgs&) -> Value { return py_capitalize(to_str(in)); }},
      {"count", [](const Value& in, const CallArgs&) { return length_of(in); }},
      {"d", do_default},
      {"default", do_default},
      {"first",
       [](const Value& in, const CallArgs&) -> Value {
         const List items = iterate(in);
         return items.empty() ? Value(Undefined{"No first item, sequence was empty."}) : items.front();
       }},
      {"float", do_float},
      {"indent", do_indent},
      {"int", do_int},
      {"items",
       [](const Value& in, const CallArgs&) -> Value {
         if (in.is_undefined()) return List{};
         if (!in.is_dict()) throw EvalError(fmt::format("items filter needs a dict, got '{}'", type_name(in)));
         List out;
         for (const auto& [k, v] : in.dict()) out.emplace_back(List{Value(k), v});
         return out;
       }},
      {"join",
       [](const Value& in, const CallArgs& args) -> Value {
         const auto a = bind("join", args, {{"d", Value("")}, {"attribute", Value(None{})}});
         std::string out;
         bool first = true;
         for (const Value& item : iterate(in)) {
           out += (first ? "" : to_str(a[0])) + to_str(a[1].is_none() ? item : attr_path(item, to_str(a[1])));
           first = false;
         }
         return out;
       }},
      {"last",
       [](const Value& in, const CallArgs&) -> Value {
         const List items = iterate(in);
         return items.empty() ? Value(Undefined{"No last item, sequence was empty."}) : items.back();
       }},
      {"length", [](const Value& in, const CallArgs&) { return length_of(in); }},
      {"list", [](const Value& in, const CallArgs&) -> Value { return iterate(in); }},
      {"lower", [](const Value& in, const CallArgs&) -> Value { return ascii_lower(to_str(in)); }},
      {"map",
       [](const Value& in, const CallArgs& args) -> Value {
         List out;
         if (args.positional.empty()) {
           const auto a = bind("map", args, {{"attribute", std::nullopt}, {"default", Value(Undefined{})}});
           for (const Value& item : iterate(in)) {
             Value v = attr_path(item, to_str(a[0]));
             out.push_back(v.is_undefined() && !a[1].is_undefined() ? a[1] : v);
           }
           return out;
         }
         const std::string filter = required_name(args, "map");
         if (!has_filter(filter)) throw EvalError(fmt::format("map(): unknown filter '{}'", filter));
         const CallArgs rest = tail(args, 1);
         for (const Value& item : iterate(in)) out.push_back(apply_filter(filter, item, rest));
         return out;
       }},
      {"reject", [](const Value& in, const CallArgs& a) { return select(in, a, false, false, "reject"); }},
      {"rejectattr", [](const Value& in, const CallArgs& a) { return select(in, a, true, false, "rejectattr"); }},
      {"replace",
       [](const Value& in, const CallArgs& args) -> Value {
         const auto a = bind("replace", args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value(None{})}});
         return py_replace(to_str(in), to_str(a[0]), to_str(a[1]), a[2].is_none() ? -1 : a[2].to_int());
       }},
      {"reverse",
       [](const Value& in, const CallArgs&) -> Value {
         if (in.is_string()) {
           std::vector<char32_t> cps = decode_utf8(in.str());
           std::reverse(cps.begin(), cps.end());
           return encode_utf8(cps);
         }
         List items = iterate(in);
         std::reverse(items.begin(), items.end());
         return items;
       }},
      {"safe", [](const Value& in, const CallArgs&) { return in; }},
      {"select", [](const Value& in, const CallArgs& a) { return select(in, a, false, true, "select"); }},
      {"selectattr", [](const Value& in, const CallArgs& a) { return select(in, a, true, true, "selectattr"); }},
      {"string", [](const Value& in, const CallArgs&) -> Value { return to_str(in); }},
      {"tojson", do_tojson},
      {"trim",
       [](const Value& in, const CallArgs& args) -> Value {
         const auto a = bind("trim", args, {{"chars", Value(None{})}});
         return py_strip(to_str(in), a[0], true, true);
       }},
      {"upper", [](const Value& in, const CallArgs&) -> Value { return ascii_upper(to_str(in)); }},
  };
  return table;
}

Filter find_filter(std::string_view name) {
  const auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

bool compare_test(const Value& in, const CallArgs& args, std::string_view op) {
  const auto a = bind(op, args, {{"other", std::nullopt}});
  if (op == "==") return equals(in, a[0]);
  if (op == "!=") return !equals(in, a[0]);
  const int c = compare(in, a[0], op);
  return op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
}

const std::map<std::string_view, Test>& tests() {
  static const std::map<std::string_view, Test> table = {
      {"boolean", [](const Value& v, const CallArgs&) { return v.is<bool>(); }},
      // Jinja's Undefined has __call__ (that raises), so it counts as callable.
      {"callable",
       [](const Value& v, const CallArgs&) { return v.is_undefined() || v.is<std::shared_ptr<const Callable>>(); }},
      {"defined", [](const Value& v, const CallArgs&) { return !v.is_undefined(); }},
      {"divisibleby",
       [](const Value& v, const CallArgs& args) {
         const auto a = bind("divisibleby", args, {{"num", std::nullopt}});
         if (!v.is_int() || !a[0].is_int() || a[0].to_int() == 0)
           throw EvalError("divisibleby needs integers and a non-zero divisor");
         return v.to_int() % a[0].to_int() == 0;
       }},
      {"eq", [](const Value& v, const CallArgs& a) { return compare_test(v, a, "=="); }},
      {"even",
       [](const Value& v, const CallArgs&) {
         return v.is_int() ? v.to_int() % 2 == 0 : throw EvalError("even needs an integer");
       }},
      {"false", [](const Value& v, const CallArgs&) { return v.is<bool>() && !v.as<bool>(); }},
      {"float", [](const Value& v, const CallArgs&) { return v.is<double>(); }},
      {"ge", [](const Value& v, const CallArgs& a) { return compare_test(v, a, ">="); }},
      {"gt", [](const Value& v, const CallArgs& a) { return compare_test(v, a, ">"); }},
      {"in",
       [](const Value& v, const CallArgs& args) {
         const auto a = bind("in", args, {{"seq", std::nullopt}});
         return contains(a[0], v);
       }},
      {"integer", [](const Value& v, const CallArgs&) { return v.is<int64_t>(); }},
      {"iterable",
       [](const Value& v, const CallArgs&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"le", [](const Value& v, const CallArgs& a) { return compare_test(v, a, "<="); }},
      {"lower", [](const Value& v, const CallArgs&) { return py_is_cased(to_str(v), false); }},
      {"lt", [](const Value& v, const CallArgs& a) { return compare_test(v, a, "<"); }},
      {"mapping", [](const Value& v, const CallArgs&) { return v.is_dict(); }},
      {"ne", [](const Value& v, const CallArgs& a) { return compare_test(v, a, "!="); }},
      {"none", [](const Value& v, const CallArgs&) { return v.is_none(); }},
      {"number", [](const Value& v, const CallArgs&) { return v.is_number(); }},
      {"odd",
       [](const Value& v, const CallArgs&) {
         return v.is_int() ? v.to_int() % 2 != 0 : throw EvalError("odd needs an integer");
       }},
      {"sameas",
       [](const Value& v, const CallArgs& args) {
         const auto a = bind("sameas", args, {{"other", std::nullopt}});
         if (v.data.index() != a[0].data.index()) return false;
         if (v.is_list()) return v.as<std::shared_ptr<const List>>() == a[0].as<std::shared_ptr<const List>>();
         if (v.is_dict()) return v.as<std::shared_ptr<const Dict>>() == a[0].as<std::shared_ptr<const Dict>>();
         return equals(v, a[0]);
       }},
      {"sequence",
       [](const Value& v, const CallArgs&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"string", [](const Value& v, const CallArgs&) { return v.is_string(); }},
      {"true", [](const Value& v, const CallArgs&) { return v.is<bool>() && v.as<bool>(); }},
      {"undefined", [](const Value& v, const CallArgs&) { return v.is_undefined(); }},
      {"upper", [](const Value& v, const CallArgs&) { return py_is_cased(to_str(v), true); }},
  };
  return table;
}

Test find_test(std::string_view name) {
  static const std::map<std::string_view, std::string_view> aliases = {
      {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"},          {"<", "lt"}, {"lessthan", "lt"},
      {"<=", "le"}, {">", "gt"},       {"greaterthan", "gt"}, {">=", "ge"}};
  if (const auto alias = aliases.find(name); alias != aliases.end()) name = alias->second;
  const auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

template <typename Table>
std::string names_of(const Table& table) {
  std::string out;
  for (const auto& [name, fn] : table) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

std::shared_ptr<const Callable> function(std::string name, std::function<Value(const CallArgs&)> fn) {
  return std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
}

// dict(*args, **kwargs) as namespace() and dict() take them.
Dict merged_dict(std::string_view fn, const CallArgs& args) {
  Dict out;
  const auto put = [&](const std::string& key, const Value& v) {
    for (auto& [k, old] : out)
      if (k == key) {
        old = v;
        return;
      }
    out.emplace_back(key, v);
  };
  if (args.positional.size() > 1) throw EvalError(fmt::format("{}() takes at most one positional argument", fn));
  if (!args.positional.empty()) {
    if (!args.positional[0].is_dict()) throw EvalError(fmt::format("{}() takes a dict as its positional argument", fn));
    for (const auto& [k, v] : args.positional[0].dict()) put(k, v);
  }
  for (const auto& [k, v] : args.keyword) put(k, v);
  return out;
}

}  // namespace

bool has_filter(std::string_view name) { return find_filter(name) != nullptr; }
bool has_test(std::string_view name) { return find_test(name) != nullptr; }
std::string filter_names() { return names_of(filters()); }
std::string test_names() { return names_of(tests()); }

Value apply_filter(std::string_view name, const Value& input, const CallArgs& args) {
  const Filter f = find_filter(name);
  if (!f) throw EvalError(fmt::format("unknown filter '{}'", name));
  return f(input, args);
}

bool apply_test(std::string_view name, const Value& input, const CallArgs& args) {
  const Test t = find_test(name);
  if (!t) throw EvalError(fmt::format("unknown test '{}'", name));
  return t(input, args);
}

Dict make_globals() {
  Dict g;
  g.emplace_back("raise_exception", function("raise_exception", [](const CallArgs& args) -> Value {
                   const auto a = bind("raise_exception", args, {{"message", std::nullopt}});
                   throw ChatTemplateRaised(to_str(a[0]));
                 }));
  g.emplace_back("strftime_now", function("strftime_now", [](const CallArgs& args) -> Value {
                   const auto a = bind("strftime_now", args, {{"format", std::nullopt}});
                   const std::time_t now = std::time(nullptr);
                   std::tm local{};
                   localtime_r(&now, &local);
                   const std::string format = to_str(a[0]);
                   if (format.empty()) return "";
                   for (size_t size = 64; size <= 65536; size *= 4) {
                     std::string buf(size, '\0');
                     const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
                     if (n > 0) return buf.substr(0, n);
                   }
                   return "";
                 }));
  g.emplace_back("namespace", function("namespace", [](const CallArgs& args) -> Value {
                   auto ns = std::make_shared<Namespace>();
                   ns->attrs = merged_dict("namespace", args);
                   for (const auto& [k, v] : ns->attrs)
                     if (!k.empty() && k[0] == '_')
                       throw EvalError(fmt::format("namespace attributes cannot start with '_', got '{}'", k));
                   return ns;
                 }));
  g.emplace_back("dict", function("dict", [](const CallArgs& args) -> Value { return merged_dict("dict", args); }));
  g.emplace_back("range", function("range", [](const CallArgs& args) -> Value {
                   const auto& p = args.positional;
                   if (p.empty() || p.size() > 3 || !args.keyword.empty() ||
                       !std::all_of(p.begin(), p.end(), [](const Value& v) { return v.is_int(); }))
                     throw EvalError("range() takes one to three integers");
                   const int64_t start = p.size() > 1 ? p[0].to_int() : 0;
                   const int64_t stop = p.size() > 1 ? p[1].to_int() : p[0].to_int();
                   const int64_t step = p.size() > 2 ? p[2].to_int() : 1;
                   if (step == 0) throw EvalError("range() arg 3 must not be zero");
                   List out;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                     if (out.size() >= 100000) throw EvalError("range() is limited to 100000 items in a template");
                     out.emplace_back(i);
                   }
                   return out;
                 }));
  return g;
}

}  // namespace colossus::data::chat::jinja
