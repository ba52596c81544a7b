// Issue 21, class 2: the loader is no looser than the reference format. The
// data region must be tiled exactly (a header length off by one used to
// shift every tensor by a byte and load), a FIFO never blocks a load, a
// symlinked file cannot lead a load out of its checkpoint folder, and errors
// never quote a file's bytes.
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "tests/checkpoint/test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

namespace colossus::checkpoint {
namespace {

using testing::TempDir;
using testing::throws_checkpoint_error;
namespace fs = std::filesystem;

const std::string kHeader = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I16","shape":[1],"data_offsets":[8,10]}})";

std::string with_length(std::string bytes, uint64_t header_bytes) {
  std::memcpy(bytes.data(), &header_bytes, 8);
  return bytes;
}

TEST(StrictLoad, TheDataRegionMustBeTiledExactly) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  const std::string data(10, '\x01');
  testing::write_bytes(path, testing::raw_safetensors(kHeader, data));
  EXPECT_NO_THROW(SafetensorsFile::open(path));
  // The header padded with a space, as writers align it; a length one short
  // still parses, but the data region then starts a byte early.
  const std::string padded = testing::raw_safetensors(kHeader + " ", data);
  testing::write_bytes(path, with_length(padded, kHeader.size()));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(path); }, {path, "cover 10 bytes", "has 11"}));
  // One long: the first data byte (a space here) is read as header.
  testing::write_bytes(path, with_length(testing::raw_safetensors(kHeader, " " + data.substr(1)), kHeader.size() + 1));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(path); }, {path}));
  // Trailing bytes, a gap, an overlap, an empty tensor off the tiling.
  testing::write_bytes(path, testing::raw_safetensors(kHeader, data + "zz"));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(path); }, {"cover 10 bytes", "has 12"}));
  const std::string gap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I16","shape":[1],"data_offsets":[9,11]}})";
  testing::write_bytes(path, testing::raw_safetensors(gap, std::string(11, '\0')));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(path); }, {"'b'", "gap"}));
  const std::string shifted = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  testing::write_bytes(path, testing::raw_safetensors(shifted, std::string(9, '\0')));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(path); }, {"'a'", "start of the data region"}));
  const std::string empty_inside =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  testing::write_bytes(path, testing::raw_safetensors(empty_inside, std::string(8, '\0')));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(path); }, {"'z'"}));
}

// Runs `fn` on a detached thread: a call that blocks forever fails the test
// instead of hanging it (the thread dies with the process).
bool finishes_within(std::function<void()> fn, std::chrono::seconds limit) {
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  std::thread([fn = std::move(fn), done] {
    try {
      fn();
    } catch (...) {
    }
    done->set_value();
  }).detach();
  return future.wait_for(limit) == std::future_status::ready;
}

TEST(StrictLoad, AFifoIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string message;
  ASSERT_TRUE(finishes_within(
      [&] {
        try {
          SafetensorsFile::open(fifo);
        } catch (const CheckpointError& e) {
          message = e.what();
        }
      },
      std::chrono::seconds(20)))
      << "opening a FIFO blocked";
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
  // The same for an index that is a FIFO.
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(dir.file("model.safetensors.index.json").c_str(), 0600), 0);
  message.clear();
  ASSERT_TRUE(finishes_within(
      [&] {
        try {
          load_state_dict(dir.path());
        } catch (const CheckpointError& e) {
          message = e.what();
        }
      },
      std::chrono::seconds(20)));
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
}

TEST(StrictLoad, SymlinksMayNotLeaveTheCheckpointFolder) {
  TempDir dir;
  const fs::path outside = dir.file("outside");
  const fs::path ckpt = dir.file("ckpt");
  fs::create_directories(outside);
  fs::create_directories(ckpt);
  const NamedTensors tensors{{"w", at::arange(4, at::kFloat)}};
  save_safetensors((outside / "stolen.safetensors").string(), tensors);
  // A shard named by the index, linked out of the folder.
  hf::write_index((ckpt / "model.safetensors.index.json").string(), {{"w", "model-00001-of-00001.safetensors"}}, 16);
  fs::create_symlink(outside / "stolen.safetensors", ckpt / "model-00001-of-00001.safetensors");
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(ckpt.string()); }, {"outside the checkpoint folder"}));
  // The single file linked out of the folder.
  fs::remove(ckpt / "model.safetensors.index.json");
  fs::create_symlink(outside / "stolen.safetensors", ckpt / "model.safetensors");
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(ckpt.string()); }, {"outside the checkpoint folder"}));
  // A link that stays inside is fine, and so is the Hugging Face hub cache's
  // snapshots/<rev>/x -> ../../blobs/<sha> layout.
  fs::remove(ckpt / "model.safetensors");
  save_safetensors((ckpt / "real.safetensors").string(), tensors);
  fs::create_symlink("real.safetensors", ckpt / "model.safetensors");
  EXPECT_NO_THROW(load_state_dict(ckpt.string()));
  const fs::path repo = dir.file("models--org--tiny");
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / "abc123");
  save_safetensors((repo / "blobs" / "f00d").string(), tensors);
  fs::create_symlink("../../blobs/f00d", repo / "snapshots" / "abc123" / "model.safetensors");
  EXPECT_TRUE(testing::same_state_dict(load_state_dict((repo / "snapshots" / "abc123").string()), tensors));
  // The same for a sharded snapshot, whose index is a link into blobs/ too.
  const fs::path sharded = repo / "snapshots" / "def456";
  fs::create_directories(sharded);
  hf::write_index((repo / "blobs" / "1dx").string(), {{"w", "model-00001-of-00001.safetensors"}}, 16);
  fs::create_symlink("../../blobs/1dx", sharded / "model.safetensors.index.json");
  fs::create_symlink("../../blobs/f00d", sharded / "model-00001-of-00001.safetensors");
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(sharded.string()), tensors));
}

TEST(StrictLoad, ErrorsNeverQuoteTheFile) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<std::string> headers{R"({"password": "SECRET-hunter2)",  // cut inside a string
                                         R"({"a": SECRET-hunter2})",
                                         R"({"a":{"dtype":"SECRET-hunter2","shape":[1],"data_offsets":[0,4]}})",
                                         R"({"a":{"dtype":"F32","shape":["SECRET-hunter2"],"data_offsets":[0,4]}})"};
  for (const auto& header : headers) {
    testing::write_bytes(path, testing::raw_safetensors(header, "abcd"));
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << "accepted " << header;
    } catch (const CheckpointError& e) {
      EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
    }
  }
  // An index that is not JSON.
  fs::remove(path);
  testing::write_bytes(dir.file("model.safetensors.index.json"), "root:SECRET-hunter2:0:0\n");
  try {
    load_state_dict(dir.path());
    ADD_FAILURE() << "accepted a non-JSON index";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace colossus::checkpoint
