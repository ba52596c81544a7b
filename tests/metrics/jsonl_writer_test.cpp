// JSONL metrics: appended records, resume without duplicate steps, torn lines.
#include "colossus/metrics/jsonl_writer.h"

#include "colossus/core/errors.h"
#include "tests/metrics/test_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

namespace colossus::metrics {

namespace fs = std::filesystem;
using testing::read_file;
using testing::scratch_dir;

namespace {

std::vector<int64_t> steps_of(const fs::path& path) {
  std::vector<int64_t> steps;
  for (const auto& record : read_metrics_jsonl(path)) steps.push_back(record.at("step").get<int64_t>());
  return steps;
}

}  // namespace

TEST(MetricsWriter, OneObjectPerLineFlushed) {
  fs::path path = scratch_dir() / "jsonl_basic" / "metrics.jsonl";
  MetricsWriter writer(path);
  writer.write(1, {{"loss", 2.5}, {"lr", 3e-4}, {"tokens_per_s", 1234.5}});
  // Flushed per record: readable while the writer is still open.
  EXPECT_EQ(read_file(path), "{\"step\":1,\"loss\":2.5,\"lr\":0.0003,\"tokens_per_s\":1234.5}\n");
  writer.write(2, {{"loss", NAN}});
  writer.write(nlohmann::ordered_json{{"step", 2}, {"eval_loss", 2.75}});
  auto records = read_metrics_jsonl(path);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_TRUE(records[1].at("loss").is_null());  // JSON has no NaN
  EXPECT_EQ(records[2].at("eval_loss").get<double>(), 2.75);
  EXPECT_THROW(writer.write(nlohmann::ordered_json::array({1, 2})), ConfigError);
}

TEST(MetricsWriter, ResumeAppendsAndDropsLaterSteps) {
  fs::path path = scratch_dir() / "jsonl_resume.jsonl";
  {
    MetricsWriter writer(path);
    for (int64_t step = 1; step <= 10; ++step) writer.write(step, {{"loss", 10.0 / static_cast<double>(step)}});
  }
  // The run crashed after step 10; the last checkpoint was at step 6.
  MetricsWriter resumed(path);
  EXPECT_EQ(resumed.truncate_after(6), 4);
  for (int64_t step = 7; step <= 8; ++step) resumed.write(step, {{"loss", 1.0}});
  EXPECT_EQ(steps_of(path), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // No temp file is left beside it.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(scratch_dir())) {
    if (entry.path().filename().string().starts_with("jsonl_resume")) ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(MetricsWriter, TornLastLine) {
  fs::path path = scratch_dir() / "jsonl_torn.jsonl";
  {
    std::ofstream out(path);
    out << "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"lo";  // a crash mid-write
  }
  MetricsWriter writer(path);
  writer.write(2, {{"loss", 2.0}});
  // The torn line stays on a line of its own and readers skip it.
  EXPECT_EQ(steps_of(path), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(writer.truncate_after(100), 1);  // only the torn line goes
  EXPECT_EQ(read_file(path), "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.0}\n");
}

TEST(MetricsWriter, Errors) {
  EXPECT_THROW(read_metrics_jsonl(scratch_dir() / "missing.jsonl"), ConfigError);
  fs::path blocker = scratch_dir() / "a_file";
  std::ofstream(blocker) << "x";
  EXPECT_THROW(MetricsWriter(blocker / "metrics.jsonl"), ConfigError);
}

}  // namespace colossus::metrics
