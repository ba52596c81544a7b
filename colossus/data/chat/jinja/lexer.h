// Tokenizing a Jinja2 template as transformers' environment does
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False): text
// between tags with whitespace control already applied, and the tokens inside
// `{{ }}` and `{% %}`. Comments leave nothing but their whitespace effects.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data::chat::jinja {

struct Pos {
  int line = 1;
  int column = 1;
};

enum class TokenKind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  TokenKind kind;
  std::string text;  // the data, name, operator or the decoded string literal
  int64_t int_value = 0;
  double float_value = 0;
  Pos pos;
};

// Throws ConfigError("chat template line L, column C: MESSAGE"); the parser
// and evaluator report their errors through it too.
[[noreturn]] void template_error(Pos pos, const std::string& message);

// Throws ConfigError naming the line and column (unclosed tag or string,
// unexpected character, unbalanced brackets).
std::vector<Token> tokenize(std::string_view source);

}  // namespace colossus::data::chat::jinja
