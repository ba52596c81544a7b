// TensorBoard event files: decoded by an independent reader (protobuf package,
// bit-wise CRC32C in metrics_oracle.py); tags, steps and values must round-trip.
#include "colossus/metrics/tensorboard_writer.h"

#include "colossus/core/errors.h"
#include "tests/metrics/test_support.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace colossus::metrics {

namespace fs = std::filesystem;
using testing::run_oracle;
using testing::scratch_dir;

TEST(TensorBoardWriter, ScalarsRoundTrip) {
  fs::path dir = scratch_dir() / "tb_roundtrip";
  fs::path file;
  {
    TensorBoardWriter writer(dir);
    file = writer.file_path();
    writer.add_scalar("train/loss", 2.5, 1, 1700000000.25);
    writer.add_scalar("train/loss", 1.75, 2, 1700000001.5);
    writer.add_scalars(300, {{"train/loss", 1.125}, {"train/lr", 3e-4}}, 1700000002.0);
    writer.add_scalar("big/step", -0.5, int64_t{1} << 40);
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string name = file.filename().string();
  EXPECT_TRUE(name.starts_with("events.out.tfevents.")) << name;
  EXPECT_TRUE(name.ends_with(std::string(".") + host)) << name;
  EXPECT_EQ(file.parent_path(), dir);

  nlohmann::json events = run_oracle("events", file);
  ASSERT_TRUE(events.is_array()) << events.dump();
  ASSERT_EQ(events.size(), 5u) << events.dump();
  EXPECT_EQ(events[0].at("file_version"), "brain.Event:2");
  EXPECT_GT(events[0].at("wall_time").get<double>(), 1.6e9);
  EXPECT_EQ(events[1].at("step"), 1);
  EXPECT_EQ(events[1].at("wall_time").get<double>(), 1700000000.25);
  EXPECT_EQ(events[1].at("scalars"), nlohmann::json::parse(R"([["train/loss", 2.5]])"));
  EXPECT_EQ(events[2].at("step"), 2);
  EXPECT_EQ(events[2].at("scalars")[0][1].get<double>(), 1.75);
  EXPECT_EQ(events[3].at("step"), 300);
  ASSERT_EQ(events[3].at("scalars").size(), 2u);
  EXPECT_EQ(events[3].at("scalars")[1][0], "train/lr");
  // Stored as float32, as TensorBoard stores simple values.
  EXPECT_EQ(events[3].at("scalars")[1][1].get<double>(), static_cast<double>(3e-4f));
  EXPECT_EQ(events[4].at("step").get<int64_t>(), int64_t{1} << 40);
  EXPECT_EQ(events[4].at("scalars")[0][1].get<double>(), -0.5);
}

TEST(TensorBoardWriter, ResumeWritesSessionStart) {
  fs::path dir = scratch_dir() / "tb_resume";
  fs::path first_file;
  fs::path second_file;
  {
    TensorBoardWriter first(dir);
    TensorBoardWriter second(dir, {.filename_suffix = ".resumed", .resume_step = 6});
    first_file = first.file_path();
    second_file = second.file_path();
  }
  EXPECT_NE(first_file, second_file);
  EXPECT_TRUE(second_file.filename().string().ends_with(".resumed")) << second_file;
  nlohmann::json events = run_oracle("events", second_file);
  ASSERT_TRUE(events.is_array()) << events.dump();
  ASSERT_EQ(events.size(), 2u) << events.dump();
  EXPECT_EQ(events[0].at("file_version"), "brain.Event:2");
  // TensorBoard drops points at steps >= this START event's step.
  EXPECT_EQ(events[1].at("session_log"), 1);
  EXPECT_EQ(events[1].at("step"), 7);
}

TEST(TensorBoardWriter, SameSecondGetsDistinctFiles) {
  fs::path dir = scratch_dir() / "tb_same_second";
  TensorBoardWriter a(dir);
  TensorBoardWriter b(dir);
  EXPECT_NE(a.file_path(), b.file_path());
}

TEST(TensorBoardWriter, Errors) {
  fs::path blocker = scratch_dir() / "tb_blocker";
  {
    std::FILE* f = std::fopen(blocker.c_str(), "w");
    std::fclose(f);
  }
  EXPECT_THROW(TensorBoardWriter(blocker / "logs"), ConfigError);
  TensorBoardWriter writer(scratch_dir() / "tb_errors");
  EXPECT_THROW(writer.add_scalar("", 1.0, 1), ConfigError);
}

}  // namespace colossus::metrics
