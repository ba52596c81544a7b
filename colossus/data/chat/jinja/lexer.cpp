// Follows jinja2/lexer.py's rules, which decide every whitespace byte of a
// rendered prompt:
// - newlines (\r\n, \r) become \n and one trailing newline is dropped;
// - `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`, `-}}`,
//   `-#}` all whitespace after it;
// - trim_blocks: one newline right after `%}` or `#}` is dropped (not `}}`);
// - lstrip_blocks: spaces and tabs between a line start and `{%` / `{#` are
//   dropped (not before `{{`); `{%+` / `+%}` opt out.
#include "colossus/data/chat/jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "colossus/core/errors.h"
#include "colossus/data/chat/jinja/value.h"

namespace colossus::data::chat::jinja {

void template_error(Pos pos, const std::string& message) {
  throw ConfigError(fmt::format("chat template line {}, column {}: {}", pos.line, pos.column, message));
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's unicode-escape decoding of a string literal's body; an unknown
// escape keeps its backslash, as Python does.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    constexpr std::string_view from = "\\'\"abfnrtv", to = "\\'\"\a\b\f\n\r\t\v";
    if (c == '\n') continue;  // line continuation
    if (const size_t k = from.find(c); k != std::string_view::npos) {
      out += to[k];
    } else if (c == 'x' || c == 'u' || c == 'U') {
      const size_t width = c == 'x' ? 2 : c == 'u' ? 4 : 8;
      char32_t cp = 0;
      for (size_t k = 1; k <= width; ++k) {
        const int h = i + k < s.size() ? hex_value(s[i + k]) : -1;
        if (h < 0) throw std::runtime_error("truncated \\" + std::string(1, c) + " escape in a string literal");
        cp = cp * 16 + static_cast<char32_t>(h);
      }
      append_utf8(out, cp);
      i += width;
    } else if (c >= '0' && c <= '7') {
      char32_t cp = 0;
      size_t k = 0;
      for (; k < 3 && i + k < s.size() && s[i + k] >= '0' && s[i + k] <= '7'; ++k) cp = cp * 8 + (s[i + k] - '0');
      append_utf8(out, cp);
      i += k - 1;
    } else {
      out += '\\';
      out += c;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view raw) {
    src_.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        src_ += '\n';
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        src_ += raw[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t tag = src_.find('{', pos_);
      while (tag != std::string::npos &&
             (tag + 1 >= n || std::string_view("{%#").find(src_[tag + 1]) == std::string_view::npos))
        tag = src_.find('{', tag + 1);
      if (tag == std::string::npos) {
        emit(TokenKind::Text, src_.substr(pos_), pos_);
        break;
      }
      std::string text = src_.substr(pos_, tag - pos_);
      const char kind = src_[tag + 1];
      size_t p = tag + 2;
      const char sign = (p < n && (src_[p] == '-' || src_[p] == '+')) ? src_[p++] : 0;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((line_start > 0 || line_starting_) && line_start < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_start), text.end(), is_space)) {
          text.resize(line_start);
        }
      }
      if (!text.empty()) emit(TokenKind::Text, std::move(text), pos_);
      pos_ = p;
      if (kind == '#') {
        skip_comment(tag);
      } else {
        emit(kind == '%' ? TokenKind::BlockBegin : TokenKind::VarBegin, src_.substr(tag, 2), tag);
        lex_tag(kind, tag);
      }
    }
    emit(TokenKind::End, "", n);
    return std::move(tokens_);
  }

 private:
  Pos pos_at(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    return {static_cast<int>(it - line_starts_.begin()) + 1, static_cast<int>(offset - *it) + 1};
  }
  void emit(TokenKind kind, std::string text, size_t offset) {
    tokens_.push_back(Token{.kind = kind, .text = std::move(text), .pos = pos_at(offset)});
  }
  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // `+X}` keeps what follows, `-X}` strips all whitespace after it and a
  // plain block or comment end drops one newline (trim_blocks).
  bool try_close(std::string_view end, bool trim_newline, bool allow_plus) {
    const size_t n = src_.size();
    if (allow_plus && at(pos_, "+") && at(pos_ + 1, end)) {
      pos_ += 1 + end.size();
    } else if (at(pos_, "-") && at(pos_ + 1, end)) {
      pos_ += 1 + end.size();
      while (pos_ < n && is_space(src_[pos_])) ++pos_;
    } else if (at(pos_, end)) {
      pos_ += end.size();
      if (trim_newline && pos_ < n && src_[pos_] == '\n') ++pos_;
    } else {
      return false;
    }
    line_starting_ = src_[pos_ - 1] == '\n';
    return true;
  }

  void skip_comment(size_t start) {
    while (pos_ < src_.size()) {
      if (try_close("#}", true, true)) return;
      ++pos_;
    }
    template_error(pos_at(start), "comment '{#' is never closed with '#}'");
  }

  void lex_tag(char kind, size_t start) {
    const std::string_view end = kind == '%' ? "%}" : "}}";
    std::vector<char> closers;  // brackets open inside the tag: `}}` in `{{ {'a': {}} }}` is not the end
    const size_t n = src_.size();
    while (true) {
      if (pos_ >= n) {
        template_error(pos_at(start), fmt::format("'{}' is never closed: expected '{}' before the end of the template",
                                                  src_.substr(start, 2), end));
      }
      const size_t begin = pos_;
      if (closers.empty() && try_close(end, kind == '%', kind == '%')) {
        emit(kind == '%' ? TokenKind::BlockEnd : TokenKind::VarEnd, std::string(end), begin);
        return;
      }
      const char c = src_[pos_];
      if (is_space(c)) {
        ++pos_;
      } else if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        while (pos_ < n && is_name_char(src_[pos_])) ++pos_;
        emit(TokenKind::Name, src_.substr(begin, pos_ - begin), begin);
      } else if (c == '\'' || c == '"') {
        size_t i = pos_ + 1;
        while (i < n && src_[i] != c) i += src_[i] == '\\' ? 2 : 1;
        if (i >= n) template_error(pos_at(begin), "string literal is never closed");
        try {
          emit(TokenKind::String, unescape(std::string_view(src_).substr(pos_ + 1, i - pos_ - 1)), begin);
        } catch (const std::exception& e) {
          template_error(pos_at(begin), e.what());
        }
        pos_ = i + 1;
      } else {
        static constexpr std::string_view two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op(1, c);
        for (std::string_view t : two)
          if (at(pos_, t)) op = t;
        if (op.size() == 1 && std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos)
          template_error(pos_at(begin), fmt::format("unexpected character '{}'", c));
        if (c == '(' || c == '[' || c == '{') closers.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        if (c == ')' || c == ']' || c == '}') {
          if (closers.empty()) template_error(pos_at(begin), fmt::format("unexpected '{}'", c));
          if (closers.back() != c)
            template_error(pos_at(begin), fmt::format("unexpected '{}', expected '{}'", c, closers.back()));
          closers.pop_back();
        }
        pos_ += op.size();
        emit(TokenKind::Op, op, begin);
      }
    }
  }

  // (\d+_)*\d+, a float when it has a fraction or an exponent; not right
  // after a '.', so `x.0.1` is two integer subscripts.
  void lex_number() {
    const size_t n = src_.size(), begin = pos_;
    const auto digits = [&] {
      while (pos_ < n && (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < n && is_digit(src_[pos_ + 1]))))
        ++pos_;
    };
    digits();
    bool is_float = false;
    if (begin == 0 || src_[begin - 1] != '.') {
      if (pos_ + 1 < n && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
        ++pos_;
        digits();
        is_float = true;
      }
      size_t e = pos_ + 1;
      if (pos_ < n && src_[pos_] == 'e') {
        if (e < n && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < n && is_digit(src_[e])) {
          pos_ = e;
          digits();
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = begin; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    Token token{.kind = is_float ? TokenKind::Float : TokenKind::Int, .text = text, .pos = pos_at(begin)};
    if (is_float) {
      token.float_value = std::strtod(text.c_str(), nullptr);
    } else if (std::from_chars(text.data(), text.data() + text.size(), token.int_value).ec != std::errc()) {
      template_error(token.pos, fmt::format("integer literal {} does not fit in 64 bits", text));
    }
    tokens_.push_back(std::move(token));
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace colossus::data::chat::jinja
