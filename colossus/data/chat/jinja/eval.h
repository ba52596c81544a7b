// Rendering parsed statements. Scoping follows Jinja2: `set` in a for body
// lives for one iteration (namespace() carries state out of a loop), `set` in
// an if body reaches the enclosing scope, macros see the template's top level.
#pragma once
#include <nlohmann/json.hpp>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "colossus/data/chat/jinja/ast.h"

namespace colossus::data::chat::jinja {

// `context` (an object) gives the template's variables, over the globals of
// builtins.h. Errors: ConfigError naming the template position of the
// expression that failed; ChatTemplateRaised from raise_exception().
std::string render(const Body& program, const nlohmann::ordered_json& context);

// [begin, end) byte offsets into a rendered string.
using ByteSpan = std::pair<size_t, size_t>;

// render(), also giving where each {% generation %} block's output lies in
// the result, in order (what transformers records for
// return_assistant_tokens_mask). A generation block inside a macro or a
// `set` block renders into text that is not the output yet, so it is refused
// (EvalError) rather than given a wrong span.
std::string render(const Body& program, const nlohmann::ordered_json& context, std::vector<ByteSpan>& generation_spans);

// Whether the program has a {% generation %} block anywhere (TRL's
// has_generation_markers).
bool has_generation_block(const Body& program);

}  // namespace colossus::data::chat::jinja
