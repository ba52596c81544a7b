#include "colossus/cluster/coordinator.h"

#include <cstdio>

namespace colossus::cluster {

void DistCoordinator::print_on_master(std::string_view msg) const {
  if (!is_master()) return;
  std::fwrite(msg.data(), 1, msg.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void DistCoordinator::master_first(const std::function<void()>& fn) const {
  if (is_master()) fn();
  block_all();
  if (!is_master()) fn();
}

}  // namespace colossus::cluster
