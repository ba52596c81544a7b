// ProcessGroupMesh: the world's ranks laid out on a grid of named axes, first
// axis outermost. group("tp") is the group of ranks that differ only along tp;
// every plugin lays out its parallel dimensions here and nowhere else.
#pragma once
#include "colossus/cluster/process_group.h"

#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace colossus::cluster {

using MeshAxes = std::vector<std::pair<std::string, int>>;

class ProcessGroupMesh {
 public:
  // Collective over `world`: creates the one-axis groups eagerly. Throws
  // ConfigError when the axis sizes do not multiply to world->size().
  ProcessGroupMesh(ProcessGroupPtr world, MeshAxes axes);

  const MeshAxes& axes() const { return axes_; }
  int size(const std::string& axis) const;
  int coordinate(const std::string& axis) const;
  std::vector<int> coordinates() const { return coordinates_; }
  // World rank of the process at the given coordinates (one per axis).
  int rank_at(const std::vector<int>& coordinates) const;

  ProcessGroupPtr group(const std::string& axis) const;
  // Spans several axes (their relative order follows the mesh). A group over
  // a new combination of axes is created on first use: a collective call that
  // every rank must make in the same order.
  ProcessGroupPtr group(const std::vector<std::string>& axes) const;
  // Without this, group({"tp", "pp"}) would pick std::string's iterator-pair
  // constructor.
  ProcessGroupPtr group(std::initializer_list<std::string> axes) const {
    return group(std::vector<std::string>(axes));
  }
  const ProcessGroupPtr& world() const { return world_; }
  // Creates the groups over each of `axis_sets` (a collective, in this order on
  // every rank; each axis's own group exists from the constructor on), then
  // seals the mesh: group() of a combination not created
  // by then throws instead of making a collective split that only the
  // calling ranks would join. Owners call it once, in their constructor.
  void create_groups_and_seal(const std::vector<std::vector<std::string>>& axis_sets);

  // Validates sizes without creating groups (for configs checked before launch).
  static void validate(const MeshAxes& axes, int world_size);

 private:
  int axis_index(const std::string& axis) const;

  ProcessGroupPtr world_;
  MeshAxes axes_;
  std::vector<int> strides_;
  std::vector<int> coordinates_;
  mutable std::map<std::vector<int>, ProcessGroupPtr> groups_;
  bool sealed_ = false;
};

}  // namespace colossus::cluster
