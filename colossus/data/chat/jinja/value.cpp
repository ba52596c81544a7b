#include "colossus/data/chat/jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace colossus::data::chat::jinja {

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None{};
    case nlohmann::ordered_json::value_t::boolean:
      return json.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer:
      return json.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw EvalError(fmt::format("integer {} is out of range", u));
      return static_cast<int64_t>(u);
    }
    case nlohmann::ordered_json::value_t::number_float:
      return json.get<double>();
    case nlohmann::ordered_json::value_t::string:
      return json.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      List list;
      for (const auto& item : json) list.push_back(from_json(item));
      return list;
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [key, item] : json.items()) dict.emplace_back(key, from_json(item));
      return dict;
    }
    default:
      throw EvalError(fmt::format("unsupported JSON value {}", json.dump()));
  }
}

void raise_undefined(const Undefined& u) { throw EvalError(u.hint.empty() ? "value is undefined" : u.hint); }

void require_defined(const Value& v) {
  if (v.is_undefined()) raise_undefined(v.as<Undefined>());
}

std::string type_name(const Value& v) {
  static constexpr const char* names[] = {"Undefined", "NoneType", "bool",      "int",         "float",   "str",
                                          "list",      "dict",     "Namespace", "LoopContext", "function"};
  return names[v.data.index()];
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest round-tripping digits, laid out by Python's repr rule:
  // positional for exponents -4..15, else d.ddde±XX.
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent <= 15) {
    if (exponent >= 0) {
      const size_t int_digits = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_digits) {
        out += digits + std::string(int_digits - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  return out + fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
}

namespace {

std::string repr_string(const std::string& s) {
  const char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

std::string repr_dict(const Dict& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + repr_string(d[i].first) + ": " + repr(d[i].second);
  return out + "}";
}

}  // namespace

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.str();
  return repr(v);
}

std::string repr(const Value& v) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined>)
          return "";
        else if constexpr (std::is_same_v<T, None>)
          return "None";
        else if constexpr (std::is_same_v<T, bool>)
          return x ? "True" : "False";
        else if constexpr (std::is_same_v<T, int64_t>)
          return std::to_string(x);
        else if constexpr (std::is_same_v<T, double>)
          return format_float(x);
        else if constexpr (std::is_same_v<T, std::string>)
          return repr_string(x);
        else if constexpr (std::is_same_v<T, std::shared_ptr<const List>>) {
          std::string out = "[";
          for (size_t i = 0; i < x->size(); ++i) out += (i ? ", " : "") + repr((*x)[i]);
          return out + "]";
        } else if constexpr (std::is_same_v<T, std::shared_ptr<const Dict>>)
          return repr_dict(*x);
        else if constexpr (std::is_same_v<T, std::shared_ptr<Namespace>>)
          return "<Namespace " + repr_dict(x->attrs) + ">";
        else if constexpr (std::is_same_v<T, std::shared_ptr<const LoopInfo>>)
          return fmt::format("<LoopContext {}/{}>", x->index0 + 1, x->items->size());
        else
          return "<function " + x->name + ">";
      },
      v.data);
}

bool truthy(const Value& v) {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>)
          return false;
        else if constexpr (std::is_same_v<T, bool>)
          return x;
        else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
          return x != 0;
        else if constexpr (std::is_same_v<T, std::string>)
          return !x.empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<const List>> ||
                           std::is_same_v<T, std::shared_ptr<const Dict>>)
          return !x->empty();
        else
          return true;
      },
      v.data);
}

const Value* find_key(const Dict& d, std::string_view key) {
  for (const auto& [k, v] : d)
    if (k == key) return &v;
  return nullptr;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is<double>() || b.is<double>()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  if (a.data.index() != b.data.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (a.is_list()) {
    const List &x = a.list(), &y = b.list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict()) {
    const Dict &x = a.dict(), &y = b.dict();
    if (x.size() != y.size()) return false;
    for (const auto& [key, value] : x) {
      const Value* other = find_key(y, key);
      if (!other || !equals(value, *other)) return false;
    }
    return true;
  }
  if (a.is<std::shared_ptr<Namespace>>())
    return a.as<std::shared_ptr<Namespace>>() == b.as<std::shared_ptr<Namespace>>();
  return false;  // loops and functions: never equal, as distinct Python objects
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is<double>() || b.is<double>()) {
      const double x = a.to_double(), y = b.to_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.to_int(), y = b.to_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  require_defined(a);
  require_defined(b);
  throw EvalError(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

List iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.list();
  if (v.is_dict()) {
    List keys;
    for (const auto& [key, value] : v.dict()) keys.emplace_back(key);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    for (char32_t c : decode_utf8(v.str())) {
      std::string s;
      append_utf8(s, c);
      chars.emplace_back(std::move(s));
    }
    return chars;
  }
  throw EvalError(fmt::format("'{}' object is not iterable", type_name(v)));
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string())
      throw EvalError(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    const List& list = container.list();
    return std::any_of(list.begin(), list.end(), [&](const Value& v) { return equals(v, item); });
  }
  if (container.is_dict()) return item.is_string() && find_key(container.dict(), item.str()) != nullptr;
  throw EvalError(fmt::format("argument of type '{}' is not iterable", type_name(container)));
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  constexpr std::u32string_view special = U"\"\\\n\r\t\b\f";
  constexpr const char* escaped[] = {"\\\"", "\\\\", "\\n", "\\r", "\\t", "\\b", "\\f"};
  for (char32_t c : decode_utf8(s)) {
    if (const size_t k = special.find(c); k != std::u32string_view::npos) {
      out += escaped[k];
    } else if (c >= 0x10000 && ensure_ascii) {  // a surrogate pair, as Python writes it
      const char32_t v = c - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
    } else if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      append_utf8(out, c);
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonStyle& style, int level) {
  const auto newline = [&](int depth) {
    if (!style.indent) return;
    out += '\n';
    for (int i = 0; i < depth; ++i) out += *style.indent;
  };
  if (v.is_none()) {
    out += "null";
  } else if (v.is<bool>()) {
    out += v.as<bool>() ? "true" : "false";
  } else if (v.is<int64_t>()) {
    out += std::to_string(v.as<int64_t>());
  } else if (v.is<double>()) {
    const double d = v.as<double>();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : format_float(d);
  } else if (v.is_string()) {
    json_string(out, v.str(), style.ensure_ascii);
  } else if (v.is_list()) {
    const List& list = v.list();
    if (list.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < list.size(); ++i) {
      if (i) out += style.item_separator;
      newline(level + 1);
      json_value(out, list[i], style, level + 1);
    }
    newline(level);
    out += ']';
  } else if (v.is_dict()) {
    Dict dict = v.dict();
    if (dict.empty()) {
      out += "{}";
      return;
    }
    if (style.sort_keys) {
      std::stable_sort(dict.begin(), dict.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out += '{';
    for (size_t i = 0; i < dict.size(); ++i) {
      if (i) out += style.item_separator;
      newline(level + 1);
      json_string(out, dict[i].first, style.ensure_ascii);
      out += style.key_separator;
      json_value(out, dict[i].second, style, level + 1);
    }
    newline(level);
    out += '}';
  } else {
    throw EvalError(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_value(out, v, style, 0);
  return out;
}

std::vector<char32_t> decode_utf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int extra = c < 0x80 ? 0 : c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : -1;
    if (extra < 0 || i + static_cast<size_t>(extra) >= s.size()) {
      out.push_back(0xfffd);  // a stray byte: kept as one replacement character
      ++i;
      continue;
    }
    char32_t cp = extra == 0 ? c : (c & (0x3f >> extra));
    for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string encode_utf8(const std::vector<char32_t>& cps) {
  std::string out;
  for (char32_t c : cps) append_utf8(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xc0) != 0x80; }));
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace colossus::data::chat::jinja
