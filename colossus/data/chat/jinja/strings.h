// Python's str operations as chat templates use them (strip, split, replace,
// capitalize, splitlines, int()/float() parsing). Whitespace is Python's
// (Unicode); case mapping is ASCII only.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "colossus/data/chat/jinja/value.h"

namespace colossus::data::chat::jinja {

// chars: None/Undefined strips whitespace, a string strips those characters.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
// sep None: runs of whitespace, empty parts dropped; maxsplit < 0: no limit.
List py_split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string py_replace(const std::string& s, const std::string& old, const std::string& replacement, int64_t count);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);
std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);
// str.islower() (upper=false) / str.isupper(): a cased letter and none of the other case.
bool py_is_cased(const std::string& s, bool upper);
// str.splitlines() without the line ends.
std::vector<std::string> split_lines(const std::string& s);
// int(s, base) and float(s); nullopt where Python raises ValueError.
std::optional<int64_t> parse_py_int(const std::string& s, int base);
std::optional<double> parse_py_float(const std::string& s);

}  // namespace colossus::data::chat::jinja
