// resolve_model_dir on the layouts the trainer and Hugging Face write, and its
// errors naming what it looked for.
#include "colossus/inference/model_dir.h"
#include "colossus/core/errors.h"
#include "tests/inference/support.h"

#include <gtest/gtest.h>

#include <fstream>

namespace colossus::inference {
namespace {

namespace fs = std::filesystem;

void touch(const fs::path& file, const std::string& text = "{}") {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

std::string error_of(const std::string& path) {
  try {
    resolve_model_dir(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ModelDir, ResolvesEveryLayout) {
  const fs::path root = testing::scratch_dir() / "layouts";
  const fs::path hf = root / "hf";
  touch(hf / "config.json");
  EXPECT_EQ(resolve_model_dir(hf.string()), hf.string());

  const fs::path run = root / "run";
  const fs::path step = run / "checkpoints" / "step-00000100";
  touch(step / "model" / "config.json");
  touch(run / "checkpoints" / "step-00000050" / "model" / "config.json");
  EXPECT_EQ(resolve_model_dir(step.string()), (step / "model").string());
  touch(run / "checkpoints" / "latest", "step-00000100\n");
  EXPECT_EQ(resolve_model_dir((run / "checkpoints").string()), (step / "model").string());
  EXPECT_EQ(resolve_model_dir(run.string()), (step / "model").string());
  touch(run / "checkpoints" / "latest", (run / "checkpoints" / "step-00000050").string());  // absolute
  EXPECT_EQ(resolve_model_dir(run.string()), (run / "checkpoints" / "step-00000050" / "model").string());
}

TEST(ModelDir, ErrorsNameWhatWasLookedFor) {
  const fs::path root = testing::scratch_dir() / "errors";
  EXPECT_NE(error_of((root / "missing").string()).find("does not exist"), std::string::npos);
  fs::create_directories(root / "empty");
  const std::string empty = error_of((root / "empty").string());
  for (const char* looked_for : {"config.json", "model/config.json", "/latest", "checkpoints/latest"}) {
    EXPECT_NE(empty.find(looked_for), std::string::npos) << empty;
  }
  touch(root / "stale" / "latest", "step-00000200");
  const std::string stale = error_of((root / "stale").string());
  EXPECT_NE(stale.find("step-00000200"), std::string::npos) << stale;
  touch(root / "blank" / "latest", "\n");
  EXPECT_NE(error_of((root / "blank").string()).find("empty"), std::string::npos);
  touch(root / "file.txt");
  EXPECT_NE(error_of((root / "file.txt").string()).find("not a directory"), std::string::npos);
}

}  // namespace
}  // namespace colossus::inference
