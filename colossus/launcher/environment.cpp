#include "colossus/launcher/environment.h"

#include <unistd.h>

extern char** environ;

namespace colossus::launcher {

Environment Environment::current() {
  Environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    auto equals = text.find('=');
    if (equals == std::string::npos || equals == 0) continue;
    env.vars_.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return env;
}

std::optional<std::string> Environment::get(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Environment::entries() const {
  std::vector<std::string> list;
  list.reserve(vars_.size());
  for (const auto& [name, value] : vars_) list.push_back(name + "=" + value);
  return list;
}

void disable_multicast_by_default(Environment& env) {
  env.set_default("NCCL_NVLS_ENABLE", "0");
  env.set_default("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1");
  env.set_default("NVSHMEM_DISABLE_NVLS", "1");
}

}  // namespace colossus::launcher
