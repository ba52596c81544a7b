// Parsing template tokens into statements, with Jinja2's expression grammar
// and precedence (jinja2/parser.py): filters and tests bind tighter than
// arithmetic, `not` looser than comparisons, `a if c else b` loosest.
#pragma once
#include <vector>

#include "colossus/data/chat/jinja/ast.h"

namespace colossus::data::chat::jinja {

// Throws ConfigError naming the line and column and what was expected: an
// unclosed block, an unknown tag, filter or test, a malformed expression.
Body parse(std::vector<Token> tokens);

}  // namespace colossus::data::chat::jinja
