// DistCoordinator: the small helpers every script wants: am I the master, print
// once, wait for everyone, run something on rank 0 first.
#pragma once
#include "colossus/cluster/process_group.h"

#include <functional>
#include <string_view>

namespace colossus::cluster {

class DistCoordinator {
 public:
  explicit DistCoordinator(ProcessGroupPtr group) : group_(std::move(group)) {}

  int rank() const { return group_->rank(); }
  int world_size() const { return group_->size(); }
  bool is_master() const { return group_->rank() == 0; }
  // Prints on rank 0 only (stdout, flushed).
  void print_on_master(std::string_view msg) const;
  void block_all() const { group_->barrier().wait(); }
  // Runs fn on rank 0 while the others wait, then on the others (e.g. a
  // download or cache build that must happen once).
  void master_first(const std::function<void()>& fn) const;

 private:
  ProcessGroupPtr group_;
};

}  // namespace colossus::cluster
