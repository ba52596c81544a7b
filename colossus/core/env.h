// Environment-variable access behind a lookup function, so code that reads the
// environment (launch info, logging) can be tested with a plain map.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace colossus {

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

EnvLookup process_env();
EnvLookup map_env(std::map<std::string, std::string> vars);

}  // namespace colossus
