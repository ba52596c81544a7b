// Values of the chat-template interpreter: Python's types as Jinja2 sees them
// (None, bool, int, float, str, list, dict) plus Jinja's Undefined, the
// namespace() object, a for-loop's `loop` and callables; and the Python
// conversions that decide rendered bytes (str(), repr(), json.dumps).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace colossus::data::chat::jinja {

// A type or lookup error inside an expression. The evaluator rethrows it as a
// ConfigError carrying the template position of the innermost expression.
struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict

// A missing variable, key or attribute. Rendering it gives "", testing it is
// false; using it as a value (arithmetic, attribute access) raises `hint`.
struct Undefined {
  std::string hint;  // "'x' is undefined", "'dict object' has no attribute 'y'"
};
struct None {};
// namespace(a=1): the one mutable object, shared by every copy of the Value.
struct Namespace {
  Dict attrs;
};
// `loop` inside a for body.
struct LoopInfo {
  int64_t index0 = 0;
  std::shared_ptr<const List> items;  // the iterated items, for length / previtem / nextitem
};
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

struct Value {
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<const List>,
                               std::shared_ptr<const Dict>, std::shared_ptr<Namespace>, std::shared_ptr<const LoopInfo>,
                               std::shared_ptr<const Callable>>;
  Storage data;

  Value() : data(Undefined{}) {}
  Value(Undefined u) : data(std::move(u)) {}
  Value(None n) : data(n) {}
  Value(bool b) : data(b) {}
  Value(int64_t i) : data(i) {}
  Value(int i) : data(static_cast<int64_t>(i)) {}
  Value(double d) : data(d) {}
  Value(std::string s) : data(std::move(s)) {}
  Value(const char* s) : data(std::string(s)) {}
  Value(List l) : data(std::make_shared<const List>(std::move(l))) {}
  Value(Dict d) : data(std::make_shared<const Dict>(std::move(d))) {}
  Value(std::shared_ptr<Namespace> ns) : data(std::move(ns)) {}
  Value(std::shared_ptr<const LoopInfo> loop) : data(std::move(loop)) {}
  Value(std::shared_ptr<const Callable> fn) : data(std::move(fn)) {}

  template <typename T>
  bool is() const {
    return std::holds_alternative<T>(data);
  }
  template <typename T>
  const T& as() const {
    return std::get<T>(data);
  }
  bool is_undefined() const { return is<Undefined>(); }
  bool is_none() const { return is<None>(); }
  bool is_string() const { return is<std::string>(); }
  bool is_int() const { return is<int64_t>() || is<bool>(); }  // bool is an int, as in Python
  bool is_number() const { return is_int() || is<double>(); }
  bool is_list() const { return is<std::shared_ptr<const List>>(); }
  bool is_dict() const { return is<std::shared_ptr<const Dict>>(); }
  const std::string& str() const { return as<std::string>(); }
  const List& list() const { return *as<std::shared_ptr<const List>>(); }
  const Dict& dict() const { return *as<std::shared_ptr<const Dict>>(); }
  int64_t to_int() const { return is<bool>() ? int64_t{as<bool>()} : as<int64_t>(); }
  double to_double() const { return is<double>() ? as<double>() : static_cast<double>(to_int()); }
};

Value from_json(const nlohmann::ordered_json& json);

// Throws the EvalError an Undefined stands for, when it is used as a value.
[[noreturn]] void raise_undefined(const Undefined& u);
void require_defined(const Value& v);

// Python's type name ('str', 'int', 'dict', 'NoneType', ...), for messages.
std::string type_name(const Value& v);
// Jinja's output of `{{ v }}`: str(v), and "" for Undefined.
std::string to_str(const Value& v);
std::string repr(const Value& v);
std::string format_float(double d);  // Python's repr(float): 1.0, 0.1, 1e-05, 1e+16
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Python's a < b (-1), a == b (0), a > b (1) for numbers, strings and lists;
// EvalError naming both types and `op` otherwise.
int compare(const Value& a, const Value& b, std::string_view op);

// Iterating as Python does: a list's items, a dict's keys, a string's
// characters; Undefined iterates as empty.
List iterate(const Value& v);
// Python's `item in container` (substring, list member, dict key).
bool contains(const Value& container, const Value& item);
const Value* find_key(const Dict& d, std::string_view key);

// Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys), as
// transformers' tojson filter calls it.
struct JsonStyle {
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_separator = ", ";  // "," when indent is set
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& v, const JsonStyle& style);

// Strings are UTF-8; Python indexes them by code point.
std::vector<char32_t> decode_utf8(std::string_view s);
std::string encode_utf8(const std::vector<char32_t>& cps);
void append_utf8(std::string& out, char32_t cp);
size_t utf8_length(std::string_view s);
bool is_py_space(char32_t c);  // str.isspace()

}  // namespace colossus::data::chat::jinja
