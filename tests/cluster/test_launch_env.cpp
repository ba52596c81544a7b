// launch_from_env's reading of torchrun, OpenMPI and SLURM variables, and the
// errors for missing or contradictory ones.
#include "colossus/cluster/launch.h"
#include "colossus/cluster/mesh.h"
#include "colossus/core/errors.h"

#include <gtest/gtest.h>

using colossus::map_env;
using colossus::cluster::first_slurm_host;
using colossus::cluster::read_launch_info;

namespace {

std::string launch_error(std::map<std::string, std::string> vars) {
  try {
    read_launch_info(map_env(std::move(vars)));
  } catch (const colossus::LaunchError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(LaunchEnv, NoVariablesMeansSingleProcess) {
  auto info = read_launch_info(map_env({}));
  EXPECT_EQ(info.source, "single");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_world_size, 1);
}

TEST(LaunchEnv, Torchrun) {
  auto info = read_launch_info(map_env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                        {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29411"}}));
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "node7");
  EXPECT_EQ(info.master_port, 29411);
}

TEST(LaunchEnv, OpenMpi) {
  auto info = read_launch_info(map_env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}));
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.local_rank, 2);
}

TEST(LaunchEnv, Slurm) {
  auto info = read_launch_info(map_env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                                        {"SLURM_NTASKS_PER_NODE", "2(x2)"}, {"SLURM_NODELIST", "gpu[03-04]"}}));
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "gpu03");
}

TEST(LaunchEnv, SlurmNodeList) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("gpu[07,09-12],cpu1"), "gpu07");
  EXPECT_EQ(first_slurm_host("a-[10-11]"), "a-10");
}

TEST(LaunchEnv, ErrorsNameTheVariables) {
  EXPECT_NE(launch_error({{"RANK", "0"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x' is not an integer"), std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4 is outside 0..3"), std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0"), std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}})
                .find("LOCAL_RANK=3"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}})
                .find("contradict"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}).find("MASTER_PORT=70000"),
            std::string::npos);
  EXPECT_NE(launch_error({{"OMPI_COMM_WORLD_RANK", "0"}}).find("OMPI_COMM_WORLD_SIZE"), std::string::npos);
  EXPECT_NE(launch_error({{"SLURM_PROCID", "0"}}).find("SLURM_NTASKS"), std::string::npos);
}

TEST(LaunchEnv, BackendNames) {
  EXPECT_EQ(colossus::cluster::resolve_backend("mpi"), "mpi");
  try {
    colossus::cluster::resolve_backend("gloo");
    FAIL() << "gloo accepted";
  } catch (const colossus::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'gloo' is not built into"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("mpi"), std::string::npos);
  }
}

TEST(MeshValidate, RefusesWrongProducts) {
  using colossus::cluster::ProcessGroupMesh;
  EXPECT_NO_THROW(ProcessGroupMesh::validate({{"dp", 2}, {"tp", 2}}, 4));
  try {
    ProcessGroupMesh::validate({{"dp", 2}, {"pp", 2}, {"tp", 2}}, 4);
    FAIL() << "8-rank mesh accepted for 4 ranks";
  } catch (const colossus::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp=2 x pp=2 x tp=2 has 8 ranks but the world has 4"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ProcessGroupMesh::validate({{"dp", 0}, {"tp", 4}}, 4), colossus::ConfigError);
  EXPECT_THROW(ProcessGroupMesh::validate({{"dp", 2}, {"dp", 2}}, 4), colossus::ConfigError);
  EXPECT_THROW(ProcessGroupMesh::validate({}, 1), colossus::ConfigError);
}
