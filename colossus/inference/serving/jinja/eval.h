// Rendering parsed statements. Scoping follows Jinja2: `set` in a for body
// lives for one iteration (namespace() carries state out of a loop), `set` in
// an if body reaches the enclosing scope, macros see the template's top level.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "colossus/inference/serving/jinja/ast.h"

namespace colossus::inference::serving::jinja {

// `context` (an object) gives the template's variables, over the globals of
// builtins.h. Errors: ConfigError naming the template position of the
// expression that failed; ChatTemplateRaised from raise_exception().
std::string render(const Body& program, const nlohmann::ordered_json& context);

}  // namespace colossus::inference::serving::jinja
