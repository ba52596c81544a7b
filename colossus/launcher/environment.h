// A process environment as a sorted name -> value map: read from our own
// environment, edited for a rank, and turned into the "NAME=value" list exec
// takes. Sorted, so dry runs print it the same way every time.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace colossus::launcher {

class Environment {
 public:
  Environment() = default;
  static Environment current();

  void set(const std::string& name, const std::string& value) { vars_[name] = value; }
  // Keeps a value the user already set.
  void set_default(const std::string& name, const std::string& value) { vars_.try_emplace(name, value); }
  void unset(const std::string& name) { vars_.erase(name); }
  std::optional<std::string> get(const std::string& name) const;

  const std::map<std::string, std::string>& vars() const { return vars_; }
  std::vector<std::string> entries() const;  // "NAME=value"

 private:
  std::map<std::string, std::string> vars_;
};

// Multicast (NVLS / symmetric-memory multicast) is off unless the user turned
// it on: it needs fabric support that many GPU hosts lack, and there NCCL and
// torch fail or hang at communicator setup instead of falling back.
void disable_multicast_by_default(Environment& env);
inline constexpr const char* kMulticastVariables[] = {"NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                      "NVSHMEM_DISABLE_NVLS"};

}  // namespace colossus::launcher
