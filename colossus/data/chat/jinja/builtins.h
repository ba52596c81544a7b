// What a chat template can call: Jinja's filters and tests, the Python string
// and dict methods templates use, attribute/item access with Jinja's
// fallbacks, and transformers' globals (raise_exception, strftime_now,
// namespace) next to Jinja's range and dict.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "colossus/data/chat/jinja/value.h"

namespace colossus::data::chat::jinja {

// Python-style binding of a call's arguments to named parameters; a
// parameter without a fallback is required. EvalError names `fn` when the
// call does not fit.
struct Param {
  std::string_view name;
  std::optional<Value> fallback;
};
std::vector<Value> bind(std::string_view fn, const CallArgs& args, std::initializer_list<Param> params);

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
// Comma-separated names, for "unknown filter" messages.
std::string filter_names();
std::string test_names();

Value apply_filter(std::string_view name, const Value& input, const CallArgs& args);
bool apply_test(std::string_view name, const Value& input, const CallArgs& args);

// object.name(args) for str, dict and loop methods; nullopt when `object` has
// no method `name` (then it may hold a callable attribute).
std::optional<Value> call_method(const Value& object, std::string_view name, const CallArgs& args);

// `obj.name` and `obj[key]`: a missing key, attribute or index gives an
// Undefined whose hint names it, as Jinja's environment.getattr/getitem.
// `obj` must not be Undefined (the caller raises that).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] with Python's slice rules, for lists and strings.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

Dict make_globals();

}  // namespace colossus::data::chat::jinja
