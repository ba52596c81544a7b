#include "colossus/apps/trainer/checkpoint_dirs.h"

#include "colossus/checkpoint/file_io.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace colossus::apps {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLatest = "latest";

std::string read_first_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

bool is_step_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

CheckpointDirs::CheckpointDirs(std::string output_dir) : output_dir_(std::move(output_dir)) {}

std::string CheckpointDirs::root() const { return (fs::path(output_dir_) / "checkpoints").string(); }

std::string CheckpointDirs::step_dir(int64_t step) const {
  return (fs::path(root()) / fmt::format("step-{:08d}", step)).string();
}

std::string CheckpointDirs::partial_dir(int64_t step) const { return step_dir(step) + ".partial"; }

void CheckpointDirs::publish(int64_t step, int64_t keep_last) const {
  const auto final_dir = step_dir(step);
  checkpoint::io::remove_tree(final_dir);
  // Every file durable before the step is published: some writers (tokenizer
  // files, config.json) do not fsync their own.
  checkpoint::io::fsync_tree(partial_dir(step));
  checkpoint::io::rename_file(partial_dir(step), final_dir);
  checkpoint::io::fsync_dir(root());
  {
    const auto latest_path = (fs::path(root()) / kLatest).string();
    checkpoint::io::TempFile out(latest_path, checkpoint::io::temp_path_for(latest_path));
    const auto text = fs::path(final_dir).filename().string() + "\n";
    out.write(text.data(), text.size());
    out.publish();
  }
  if (keep_last <= 0) return;
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(root())) {
    const auto name = entry.path().filename().string();
    if (entry.is_directory() && is_step_name(name)) steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());
  const auto newest = fs::path(final_dir).filename().string();
  int64_t kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    // The one just published always stays, whatever its number.
    if (*it == newest || kept < keep_last - 1) {
      if (*it != newest) ++kept;
      continue;
    }
    checkpoint::io::remove_tree((fs::path(root()) / *it).string());
  }
}

std::optional<std::string> CheckpointDirs::latest() const {
  const auto latest_path = fs::path(root()) / kLatest;
  if (!fs::exists(latest_path)) return std::nullopt;
  const auto name = read_first_line(latest_path);
  const auto dir = fs::path(root()) / name;
  if (name.empty() || !fs::is_directory(dir)) {
    throw CheckpointError(fmt::format("{} names '{}', which is not a checkpoint directory in {}",
                                      latest_path.string(), name, root()));
  }
  return dir.string();
}

std::optional<std::string> resolve_resume_dir(const std::string& argument, const CheckpointDirs& dirs) {
  if (argument == "auto" || argument == "latest") return dirs.latest();
  const fs::path path(argument);
  if (!fs::exists(path)) {
    throw CheckpointError(fmt::format("--resume {}: no such file or directory; pass a step directory "
                                      "(.../checkpoints/step-00000100), a run directory, or 'auto'",
                                      argument));
  }
  if (fs::exists(path / "train_state.json")) return path.string();
  for (const auto& candidate : {path / kLatest, path / "checkpoints" / kLatest}) {
    if (fs::exists(candidate)) {
      const auto dir = candidate.parent_path() / read_first_line(candidate);
      if (fs::exists(dir / "train_state.json")) return dir.string();
      throw CheckpointError(fmt::format("--resume {}: {} names {}, which has no train_state.json", argument,
                                        candidate.string(), dir.string()));
    }
  }
  throw CheckpointError(fmt::format("--resume {}: neither a checkpoint (no train_state.json) nor a run directory "
                                    "(no checkpoints/latest)",
                                    argument));
}

int64_t step_of_dir(const std::string& dir) {
  auto name = fs::path(dir).filename().string();
  if (name.empty()) name = fs::path(dir).parent_path().filename().string();
  if (!is_step_name(name)) {
    throw CheckpointError(fmt::format("{} is not a step directory (expected a name like step-00000100)", dir));
  }
  return std::stoll(name.substr(5));
}

}  // namespace colossus::apps
