// The filesystem plumbing the checkpoint protocols stand on: remove_tree
// (POSIX only, links removed but never followed) and fsync_tree.
#include "colossus/checkpoint/file_io.h"
#include "tests/checkpoint/test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace colossus::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

TEST(RemoveTree, RemovesNestedDirectoriesButNeverFollowsALink) {
  TempDir dir;
  const fs::path root(dir.path());
  const fs::path outside = root / "outside";
  fs::create_directories(outside);
  std::ofstream(outside / "keep.txt") << "precious";
  const fs::path step = root / "step-00000020";
  fs::create_directories(step / "model" / "shards");
  std::ofstream(step / "model" / "model.safetensors") << "weights";
  std::ofstream(step / "model" / "shards" / "a") << "a";
  std::ofstream(step / "train_state.json") << "{}";
  fs::create_directory_symlink(outside, step / "link_to_outside");
  fs::create_symlink(outside / "keep.txt", step / "model" / "file_link");

  io::fsync_tree(step.string());
  io::remove_tree(step.string());
  EXPECT_FALSE(fs::exists(fs::symlink_status(step)));
  EXPECT_TRUE(fs::exists(outside / "keep.txt")) << "remove_tree followed a link out of the tree";

  // A missing path is not an error; a link given as the root is removed, not followed.
  EXPECT_NO_THROW(io::remove_tree((root / "missing").string()));
  fs::create_directory_symlink(outside, root / "root_link");
  io::remove_tree((root / "root_link").string());
  EXPECT_FALSE(fs::exists(fs::symlink_status(root / "root_link")));
  EXPECT_TRUE(fs::exists(outside / "keep.txt"));
}

}  // namespace
}  // namespace colossus::checkpoint
