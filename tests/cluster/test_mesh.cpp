// ProcessGroupMesh over real MPI ranks: coordinates, group membership for
// every axis and axis pair, communication inside subgroups, and refusal of a
// mesh that does not match the world size.
#include "colossus/cluster/mesh.h"
#include "colossus/core/errors.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

using colossus::cluster::MeshAxes;
using colossus::cluster::ProcessGroupMesh;
using colossus::testing::world;

namespace {

// Layouts of `n` ranks to check: dp outside and inside, and three axes.
std::vector<MeshAxes> layouts(int n) {
  std::vector<MeshAxes> out{{{"dp", n}}, {{"dp", n}, {"tp", 1}}};
  if (n % 2 == 0) {
    out.push_back({{"dp", n / 2}, {"tp", 2}});  // dp outside
    out.push_back({{"tp", 2}, {"dp", n / 2}});  // dp inside
  }
  if (n == 4) out.push_back({{"dp", 1}, {"pp", 2}, {"tp", 2}});
  return out;
}

}  // namespace

TEST(Mesh, GroupsMatchTheGrid) {
  auto pg = world();
  for (const auto& axes : layouts(pg->size())) {
    ProcessGroupMesh mesh(pg, axes);
    auto coords = mesh.coordinates();
    EXPECT_EQ(mesh.rank_at(coords), pg->rank());
    for (size_t a = 0; a < axes.size(); ++a) {
      auto group = mesh.group(axes[a].first);
      ASSERT_EQ(group->size(), axes[a].second);
      EXPECT_EQ(group->rank(), coords[a]);
      // Members differ from us only along axis a, in coordinate order.
      for (int k = 0; k < group->size(); ++k) {
        auto member = coords;
        member[a] = k;
        EXPECT_EQ(group->global_rank(k), mesh.rank_at(member));
      }
      // The sum of world ranks over the group, computed by communication.
      auto t = at::full({1}, static_cast<double>(pg->rank()), at::kDouble);
      group->all_reduce(t).wait();
      double expected = 0;
      for (int g : group->global_ranks()) expected += g;
      EXPECT_EQ(t.item<double>(), expected);
    }
  }
}

TEST(Mesh, MultiAxisGroupsAndCache) {
  auto pg = world();
  if (pg->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ProcessGroupMesh mesh(pg, {{"dp", 1}, {"pp", 2}, {"tp", 2}});
  auto pp_tp = mesh.group({"tp", "pp"});  // order given does not matter
  EXPECT_EQ(pp_tp->size(), 4);
  EXPECT_EQ(pp_tp.get(), mesh.group({"pp", "tp"}).get()) << "groups are created once and cached";
  EXPECT_EQ(mesh.group("tp").get(), mesh.group("tp").get());
  auto dp_tp = mesh.group({"dp", "tp"});
  EXPECT_EQ(dp_tp->size(), 2);
  auto t = at::ones({2});
  dp_tp->all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t, at::full({2}, 2.0f)));
}

TEST(Mesh, ASealedMeshHandsOutOnlyTheGroupsCreatedUpFront) {
  auto pg = world();
  if (pg->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ProcessGroupMesh mesh(pg, {{"dp", 1}, {"pp", 2}, {"tp", 2}});
  mesh.create_groups_and_seal({{"pp", "tp"}});
  EXPECT_EQ(mesh.group({"tp", "pp"})->size(), 4);
  EXPECT_EQ(mesh.group("pp")->size(), 2) << "each axis's own group is made with the mesh";
  // Creating dp x pp now would be a split that only the ranks asking join.
  try {
    mesh.group({"dp", "pp"});
    FAIL() << "a sealed mesh created a new group";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("mesh group over [dp, pp] was not created"), std::string::npos) << e.what();
  }
}

TEST(Mesh, RefusesBadLayouts) {
  auto pg = world();
  int n = pg->size();
  try {
    ProcessGroupMesh mesh(pg, {{"dp", n}, {"tp", 2}});
    FAIL() << "mesh with twice the ranks accepted";
  } catch (const colossus::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("has {} ranks but the world has {}", 2 * n, n)), std::string::npos)
        << e.what();
  }
  ProcessGroupMesh mesh(pg, {{"dp", n}});
  try {
    mesh.group("tp");
    FAIL() << "unknown axis accepted";
  } catch (const colossus::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no axis 'tp'; its axes are dp"), std::string::npos) << e.what();
  }
}

int main(int argc, char** argv) { return colossus::testing::run_all_tests(argc, argv); }
