#include "colossus/inference/model_dir.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace colossus::inference {

namespace {

namespace fs = std::filesystem;

bool is_file(const fs::path& p) {
  std::error_code error;
  return fs::is_regular_file(p, error);
}

// A model directory, or a step directory holding one in model/; nullopt if neither.
std::optional<fs::path> model_dir_in(const fs::path& dir) {
  if (is_file(dir / "config.json")) return dir;
  if (is_file(dir / "model" / "config.json")) return dir / "model";
  return std::nullopt;
}

// The step directory that checkpoints_dir/latest names (one line; surrounding
// whitespace ignored), as a model directory.
fs::path follow_latest(const fs::path& checkpoints_dir) {
  const fs::path latest = checkpoints_dir / "latest";
  std::ifstream in(latest);
  std::stringstream text;
  text << in.rdbuf();
  std::string name = text.str();
  const auto first = name.find_first_not_of(" \t\r\n");
  const auto last = name.find_last_not_of(" \t\r\n");
  name = first == std::string::npos ? "" : name.substr(first, last - first + 1);
  if (!in || name.empty()) {
    throw CheckpointError(
        fmt::format("'{}' is empty or unreadable; it should name the newest step directory "
                    "(e.g. step-00000100)",
                    latest.string()));
  }
  const fs::path step = fs::path(name).is_absolute() ? fs::path(name) : checkpoints_dir / name;
  if (auto dir = model_dir_in(step)) return *dir;
  throw CheckpointError(
      fmt::format("'{}' names '{}', but '{}' holds neither config.json nor model/config.json "
                  "(an interrupted save? pass a step directory explicitly)",
                  latest.string(), name, step.string()));
}

}  // namespace

std::string resolve_model_dir(const std::string& path) {
  const fs::path p(path);
  std::error_code error;
  if (!fs::exists(p, error)) {
    throw CheckpointError(
        fmt::format("model path '{}' does not exist; expected a model directory (config.json + "
                    "safetensors), a checkpoint step directory, or a run directory",
                    path));
  }
  if (!fs::is_directory(p, error)) {
    throw CheckpointError(
        fmt::format("model path '{}' is not a directory; expected a model directory (config.json + "
                    "safetensors), a checkpoint step directory, or a run directory",
                    path));
  }
  if (auto dir = model_dir_in(p)) return dir->string();
  if (is_file(p / "latest")) return follow_latest(p).string();
  if (is_file(p / "checkpoints" / "latest")) return follow_latest(p / "checkpoints").string();
  throw CheckpointError(
      fmt::format("'{}' holds no model: looked for {}/config.json (model directory), "
                  "{}/model/config.json (checkpoint step), {}/latest (checkpoints directory) and "
                  "{}/checkpoints/latest (run directory)",
                  path, path, path, path, path));
}

}  // namespace colossus::inference
