// Attribute, item and slice access with Jinja's fallbacks (a missing name is
// an Undefined, an error only once it is used), the str / dict / loop methods
// templates call, and Python-style argument binding.
#include <fmt/format.h>

#include <algorithm>

#include "colossus/data/chat/jinja/builtins.h"
#include "colossus/data/chat/jinja/strings.h"

namespace colossus::data::chat::jinja {

std::vector<Value> bind(std::string_view fn, const CallArgs& args, std::initializer_list<Param> params) {
  if (args.positional.size() > params.size())
    throw EvalError(fmt::format("{}() takes at most {} argument{} ({} given)", fn, params.size(),
                                params.size() == 1 ? "" : "s", args.positional.size()));
  std::vector<std::optional<Value>> bound(params.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find_if(params.begin(), params.end(), [&](const Param& p) { return p.name == key; });
    if (it == params.end()) throw EvalError(fmt::format("{}() got an unexpected keyword argument '{}'", fn, key));
    auto& slot = bound[static_cast<size_t>(it - params.begin())];
    if (slot) throw EvalError(fmt::format("{}() got multiple values for argument '{}'", fn, key));
    slot = value;
  }
  std::vector<Value> out;
  size_t i = 0;
  for (const Param& p : params) {
    if (!bound[i] && !p.fallback) throw EvalError(fmt::format("{}() missing required argument '{}'", fn, p.name));
    out.push_back(bound[i] ? *bound[i] : *p.fallback);
    ++i;
  }
  return out;
}

namespace {

Undefined missing_attr(const Value& obj, const std::string& name) {
  return Undefined{fmt::format("'{} object' has no attribute '{}'", type_name(obj), name)};
}

Value loop_attr(const LoopInfo& loop, const std::string& name) {
  const auto length = static_cast<int64_t>(loop.items->size());
  const int64_t i = loop.index0;
  if (name == "index") return i + 1;
  if (name == "index0") return i;
  if (name == "revindex") return length - i;
  if (name == "revindex0") return length - i - 1;
  if (name == "first") return i == 0;
  if (name == "last") return i == length - 1;
  if (name == "length") return length;
  if (name == "depth") return 1;
  if (name == "depth0") return 0;
  if (name == "previtem")
    return i > 0 ? (*loop.items)[static_cast<size_t>(i - 1)] : Value(Undefined{"there is no previous item"});
  if (name == "nextitem")
    return i + 1 < length ? (*loop.items)[static_cast<size_t>(i + 1)] : Value(Undefined{"there is no next item"});
  return Undefined{fmt::format("'LoopContext object' has no attribute '{}'", name)};
}

bool starts_or_ends(const std::string& s, const Value& affix, bool start, std::string_view fn) {
  const auto one = [&](const Value& a) {
    if (!a.is_string())
      throw EvalError(fmt::format("{} first arg must be str or a tuple of str, not {}", fn, type_name(a)));
    const std::string& x = a.str();
    return x.size() <= s.size() &&
           (start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (!affix.is_list()) return one(affix);
  const List& options = affix.list();
  return std::any_of(options.begin(), options.end(), one);
}

std::optional<Value> string_method(const std::string& s, std::string_view name, const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto a = bind(name, args, {{"chars", Value(None{})}});
    return py_strip(s, a[0], name != "rstrip", name != "lstrip");
  }
  if (name == "split") {
    const auto a = bind(name, args, {{"sep", Value(None{})}, {"maxsplit", Value(-1)}});
    return py_split(s, a[0], a[1].to_int());
  }
  if (name == "startswith" || name == "endswith") {
    const auto a = bind(name, args, {{name == "startswith" ? "prefix" : "suffix", std::nullopt}});
    return starts_or_ends(s, a[0], name == "startswith", name);
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title" || name == "splitlines") {
    bind(name, args, {});
    if (name == "splitlines") {
      List lines;
      for (std::string& line : split_lines(s)) lines.emplace_back(std::move(line));
      return lines;
    }
    return name == "upper"   ? ascii_upper(s)
           : name == "lower" ? ascii_lower(s)
           : name == "title" ? py_title(s)
                             : py_capitalize(s);
  }
  if (name == "replace") {
    const auto a = bind(name, args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value(-1)}});
    if (!a[0].is_string() || !a[1].is_string()) throw EvalError("replace() arguments must be str");
    return py_replace(s, a[0].str(), a[1].str(), a[2].to_int());
  }
  if (name == "find" || name == "count") {
    const auto a = bind(name, args, {{"sub", std::nullopt}});
    if (!a[0].is_string()) throw EvalError(fmt::format("{}() argument must be str, not {}", name, type_name(a[0])));
    const std::string& sub = a[0].str();
    if (name == "find") {
      const size_t at = s.find(sub);
      return at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(utf8_length(s.substr(0, at)));
    }
    if (sub.empty()) return static_cast<int64_t>(utf8_length(s) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return n;
  }
  if (name == "join") {
    const auto a = bind(name, args, {{"iterable", std::nullopt}});
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(a[0])) {
      if (!item.is_string())
        throw EvalError(fmt::format("sequence item {}: expected str instance, {} found", i, type_name(item)));
      out += (i++ ? s : "") + item.str();
    }
    return out;
  }
  return std::nullopt;
}

std::optional<Value> dict_method(const Dict& d, std::string_view name, const CallArgs& args) {
  if (name == "items" || name == "keys" || name == "values") {
    bind(name, args, {});
    List out;
    for (const auto& [k, v] : d) {
      if (name == "items")
        out.emplace_back(List{Value(k), v});
      else
        out.push_back(name == "keys" ? Value(k) : v);
    }
    return out;
  }
  if (name == "get") {
    const auto a = bind(name, args, {{"key", std::nullopt}, {"default", Value(None{})}});
    const Value* found = a[0].is_string() ? find_key(d, a[0].str()) : nullptr;
    return found ? *found : a[1];
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> call_method(const Value& object, std::string_view name, const CallArgs& args) {
  static constexpr std::string_view mutators[] = {"append", "extend",  "insert", "pop",        "remove", "clear",
                                                  "sort",   "reverse", "update", "setdefault", "popitem"};
  if ((object.is_list() || object.is_dict()) &&
      std::find(std::begin(mutators), std::end(mutators), name) != std::end(mutators))
    throw EvalError(
        fmt::format("{}.{}() would modify a {}: chat templates only read their data (use namespace() "
                    "for mutable state)",
                    type_name(object), name, type_name(object)));
  if (object.is_string()) return string_method(object.str(), name, args);
  if (object.is_dict()) return dict_method(object.dict(), name, args);
  if (object.is<std::shared_ptr<const LoopInfo>>() && name == "cycle") {
    if (args.positional.empty()) throw EvalError("loop.cycle() needs at least one argument");
    const auto& loop = *object.as<std::shared_ptr<const LoopInfo>>();
    return args.positional[static_cast<size_t>(loop.index0) % args.positional.size()];
  }
  return std::nullopt;
}

namespace {

// Python's method names: `d.items` and `s.strip` are bound methods (truthy)
// before they are keys, as Jinja's getattr finds them first; so a JSON schema's
// "items" key is only reachable as d['items'].
constexpr std::string_view kDictMethods[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                             "pop",   "popitem", "setdefault", "update", "values"};
constexpr std::string_view kStrMethods[] = {
    "capitalize",   "casefold",   "center",    "count",       "encode",    "endswith",     "expandtabs",   "find",
    "format",       "format_map", "index",     "isalnum",     "isalpha",   "isascii",      "isdecimal",    "isdigit",
    "isidentifier", "islower",    "isnumeric", "isprintable", "isspace",   "istitle",      "isupper",      "join",
    "ljust",        "lower",      "lstrip",    "maketrans",   "partition", "removeprefix", "removesuffix", "replace",
    "rfind",        "rindex",     "rjust",     "rpartition",  "rsplit",    "rstrip",       "split",        "splitlines",
    "startswith",   "strip",      "swapcase",  "title",       "translate", "upper",        "zfill"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Value bound_method(const Value& obj, const std::string& name) {
  return std::make_shared<const Callable>(
      Callable{name, [obj, name](const CallArgs& args) {
                 if (auto result = call_method(obj, name, args)) return *result;
                 throw EvalError(fmt::format("{}.{}() is not supported in chat templates", type_name(obj), name));
               }});
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if ((obj.is_dict() && listed(kDictMethods, name)) || (obj.is_string() && listed(kStrMethods, name)))
    return bound_method(obj, name);
  if (obj.is_dict()) {
    const Value* v = find_key(obj.dict(), name);
    return v ? *v : Value(missing_attr(obj, name));
  }
  if (obj.is<std::shared_ptr<Namespace>>()) {
    const Value* v = find_key(obj.as<std::shared_ptr<Namespace>>()->attrs, name);
    return v ? *v : Value(missing_attr(obj, name));
  }
  if (obj.is<std::shared_ptr<const LoopInfo>>()) return loop_attr(*obj.as<std::shared_ptr<const LoopInfo>>(), name);
  return missing_attr(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  if (key.is_string()) {  // obj[key], then getattr(obj, key), as Jinja's getitem
    const Value* v = obj.is_dict() ? find_key(obj.dict(), key.str()) : nullptr;
    return v ? *v : get_attr(obj, key.str());
  }
  if (key.is_int() && (obj.is_list() || obj.is_string())) {
    int64_t i = key.to_int();
    const auto size = static_cast<int64_t>(obj.is_list() ? obj.list().size() : utf8_length(obj.str()));
    if (i < 0) i += size;
    if (i >= 0 && i < size) {
      if (obj.is_list()) return obj.list()[static_cast<size_t>(i)];
      std::string c;
      append_utf8(c, decode_utf8(obj.str())[static_cast<size_t>(i)]);
      return c;
    }
  }
  return Undefined{fmt::format("'{} object' has no element {}", type_name(obj), repr(key))};
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  for (const Value* part : {&start, &stop, &step})
    if (!part->is_none() && !part->is_undefined() && !part->is_int())
      throw EvalError("slice indices must be integers or None");
  const auto given = [](const Value& v) { return v.is_int(); };
  const int64_t by = given(step) ? step.to_int() : 1;
  if (by == 0) throw EvalError("slice step cannot be zero");
  std::vector<char32_t> cps;
  if (obj.is_string())
    cps = decode_utf8(obj.str());
  else if (!obj.is_list())
    throw EvalError(fmt::format("'{}' object is not subscriptable", type_name(obj)));
  const auto len = static_cast<int64_t>(obj.is_list() ? obj.list().size() : cps.size());
  // PySlice_AdjustIndices
  const auto adjust = [&](const Value& v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = v.to_int();
    if (i < 0) {
      i += len;
      if (i < 0) i = by < 0 ? -1 : 0;
    } else if (i >= len) {
      i = by < 0 ? len - 1 : len;
    }
    return i;
  };
  const int64_t from = adjust(start, by > 0 ? 0 : len - 1);
  const int64_t to = adjust(stop, by > 0 ? len : -1);
  List items;
  std::vector<char32_t> chars;
  for (int64_t i = from; by > 0 ? i < to : i > to; i += by) {
    if (obj.is_list())
      items.push_back(obj.list()[static_cast<size_t>(i)]);
    else
      chars.push_back(cps[static_cast<size_t>(i)]);
  }
  return obj.is_list() ? Value(std::move(items)) : Value(encode_utf8(chars));
}

}  // namespace colossus::data::chat::jinja
