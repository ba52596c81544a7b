#include "colossus/data/chat/jinja/strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

namespace colossus::data::chat::jinja {

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace && !chars.is_string())
    throw EvalError(fmt::format("strip arg must be None or str, not {}", type_name(chars)));
  const std::vector<char32_t> set = whitespace ? std::vector<char32_t>{} : decode_utf8(chars.str());
  const auto strip = [&](char32_t c) {
    return whitespace ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  const std::vector<char32_t> cps = decode_utf8(s);
  size_t begin = 0, end = cps.size();
  while (left && begin < end && strip(cps[begin])) ++begin;
  while (right && end > begin && strip(cps[end - 1])) --end;
  return encode_utf8(std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(begin),
                                           cps.begin() + static_cast<std::ptrdiff_t>(end)));
}

List py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::vector<char32_t> cps = decode_utf8(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.emplace_back(encode_utf8({cps.begin() + static_cast<std::ptrdiff_t>(i), cps.end()}));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      parts.emplace_back(
          encode_utf8({cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j)}));
      i = j;
    }
    return parts;
  }
  if (!sep.is_string()) throw EvalError(fmt::format("must be str or None, not {}", type_name(sep)));
  const std::string& d = sep.str();
  if (d.empty()) throw EvalError("empty separator");
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t at = s.find(d, start);
    if (at == std::string::npos) break;
    parts.emplace_back(s.substr(start, at - start));
    start = at + d.size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& replacement, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts the replacement around every character
    const std::vector<char32_t> cps = decode_utf8(s);
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      append_utf8(out, c);
    }
    if (count < 0 || done < count) out += replacement;
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + replacement;
    start = at + old.size();
    ++done;
  }
  return out + s.substr(start);
}

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

std::string py_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out = ascii_upper(out.substr(0, 1)) + out.substr(1);
  return out;
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    const bool cased = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (cased) c = previous_cased ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
    previous_cased = cased;
  }
  return out;
}

bool py_is_cased(const std::string& s, bool upper) {
  bool any = false;
  for (char c : s) {
    if (c >= 'a' && c <= 'z') {
      if (upper) return false;
      any = true;
    } else if (c >= 'A' && c <= 'Z') {
      if (!upper) return false;
      any = true;
    }
  }
  return any;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  const std::vector<char32_t> cps = decode_utf8(s);
  std::vector<char32_t> line;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool boundary = c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
                          c == 0x2028 || c == 0x2029;
    if (!boundary) {
      line.push_back(c);
      continue;
    }
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    lines.push_back(encode_utf8(line));
    line.clear();
  }
  if (!line.empty()) lines.push_back(encode_utf8(line));
  return lines;
}

std::optional<int64_t> parse_py_int(const std::string& s, int base) {
  std::string t = py_strip(s, None{}, true, true);
  bool negative = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    negative = t[0] == '-';
    t.erase(0, 1);
  }
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {  // underscores only between digits, as Python allows
    if (t[i] == '_' && i > 0 && i + 1 < t.size() && t[i - 1] != '_') continue;
    digits += t[i];
  }
  if (digits.empty() || base < 2 || base > 36) return std::nullopt;
  uint64_t magnitude = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
  if (magnitude > static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

std::optional<double> parse_py_float(const std::string& s) {
  const std::string t = py_strip(s, None{}, true, true);
  if (t.empty() || t.find_first_of("xX_") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

}  // namespace colossus::data::chat::jinja
