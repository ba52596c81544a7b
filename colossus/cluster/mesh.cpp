#include "colossus/cluster/mesh.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace colossus::cluster {

namespace {

std::string describe(const MeshAxes& axes) {
  std::vector<std::string> parts;
  for (const auto& [name, size] : axes) parts.push_back(fmt::format("{}={}", name, size));
  return fmt::format("{}", fmt::join(parts, " x "));
}

}  // namespace

void ProcessGroupMesh::validate(const MeshAxes& axes, int world_size) {
  if (axes.empty()) throw ConfigError("a ProcessGroupMesh needs at least one axis, e.g. {{\"dp\", world_size}}");
  std::set<std::string> seen;
  int64_t product = 1;
  for (const auto& [name, size] : axes) {
    if (name.empty()) throw ConfigError("mesh axis names must not be empty");
    if (!seen.insert(name).second) throw ConfigError(fmt::format("mesh axis '{}' appears twice in {}", name, describe(axes)));
    if (size < 1) throw ConfigError(fmt::format("mesh axis '{}' has size {}; sizes must be >= 1", name, size));
    product *= size;
  }
  if (product != world_size) {
    throw ConfigError(fmt::format("mesh {} has {} ranks but the world has {}; the axis sizes must multiply to {}",
                                  describe(axes), product, world_size, world_size));
  }
}

ProcessGroupMesh::ProcessGroupMesh(ProcessGroupPtr world, MeshAxes axes)
    : world_(std::move(world)), axes_(std::move(axes)) {
  validate(axes_, world_->size());
  strides_.assign(axes_.size(), 1);
  for (int i = static_cast<int>(axes_.size()) - 2; i >= 0; --i) strides_[i] = strides_[i + 1] * axes_[i + 1].second;
  int rank = world_->rank();
  for (size_t i = 0; i < axes_.size(); ++i) coordinates_.push_back((rank / strides_[i]) % axes_[i].second);
  for (const auto& [name, size] : axes_) (void)group(name);
}

int ProcessGroupMesh::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].first == axis) return static_cast<int>(i);
  }
  std::vector<std::string> names;
  for (const auto& a : axes_) names.push_back(a.first);
  throw ConfigError(fmt::format("mesh has no axis '{}'; its axes are {}", axis, fmt::join(names, ", ")));
}

int ProcessGroupMesh::size(const std::string& axis) const { return axes_[axis_index(axis)].second; }
int ProcessGroupMesh::coordinate(const std::string& axis) const { return coordinates_[axis_index(axis)]; }

int ProcessGroupMesh::rank_at(const std::vector<int>& coordinates) const {
  if (coordinates.size() != axes_.size()) {
    throw ConfigError(fmt::format("rank_at: got {} coordinates for a mesh of {} axes", coordinates.size(), axes_.size()));
  }
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (coordinates[i] < 0 || coordinates[i] >= axes_[i].second) {
      throw ConfigError(fmt::format("rank_at: coordinate {} on axis '{}' is outside 0..{}", coordinates[i],
                                    axes_[i].first, axes_[i].second - 1));
    }
    rank += coordinates[i] * strides_[i];
  }
  return rank;
}

ProcessGroupPtr ProcessGroupMesh::group(const std::string& axis) const {
  return group(std::vector<std::string>{axis});
}

ProcessGroupPtr ProcessGroupMesh::group(const std::vector<std::string>& axes) const {
  std::vector<int> indices;
  for (const auto& a : axes) indices.push_back(axis_index(a));
  std::sort(indices.begin(), indices.end());
  if (std::adjacent_find(indices.begin(), indices.end()) != indices.end()) {
    throw ConfigError(fmt::format("mesh group over [{}] names an axis twice", fmt::join(axes, ", ")));
  }
  auto it = groups_.find(indices);
  if (it != groups_.end()) return it->second;
  if (sealed_) {
    throw std::logic_error(fmt::format(
        "mesh group over [{}] was not created with the mesh's others; add it to create_groups_and_seal (creating "
        "it here would be a collective split that only the ranks calling this would join)",
        fmt::join(axes, ", ")));
  }
  // color: position on the axes not in the group; key: position within it.
  int color = 0, key = 0;
  std::vector<std::string> names;
  for (size_t i = 0; i < axes_.size(); ++i) {
    bool inside = std::binary_search(indices.begin(), indices.end(), static_cast<int>(i));
    if (inside) {
      key = key * axes_[i].second + coordinates_[i];
      names.push_back(axes_[i].first);
    } else {
      color = color * axes_[i].second + coordinates_[i];
    }
  }
  auto created = world_->split(color, key, fmt::format("{}", fmt::join(names, "+")));
  groups_.emplace(indices, created);
  return created;
}

void ProcessGroupMesh::create_groups_and_seal(const std::vector<std::vector<std::string>>& axis_sets) {
  for (const auto& axes : axis_sets) group(axes);
  sealed_ = true;
}

}  // namespace colossus::cluster
