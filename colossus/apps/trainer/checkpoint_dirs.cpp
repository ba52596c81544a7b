#include "colossus/apps/trainer/checkpoint_dirs.h"

#include "colossus/checkpoint/file_io.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

namespace colossus::apps {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLatest = "latest";
constexpr const char* kTrainState = "train_state.json";

// Whether anything (a dangling link too) is at `path`; a path that cannot be
// stat-ed counts as absent.
bool present(const fs::path& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / kTrainState, ec);
}

// Step directory names in `root` (complete or not), by step number.
std::vector<std::string> step_names(const fs::path& root) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (is_step_dir_name(name) && it->is_directory(ec)) names.push_back(name);
  }
  // By number: names wider than the usual 8 digits would sort wrongly as text.
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return step_of_dir(a) < step_of_dir(b); });
  return names;
}

std::vector<std::string> complete_step_dirs(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& name : step_names(root)) {
    if (is_complete(root / name)) out.push_back((root / name).string());
  }
  return out;
}

// The directory `root/latest` names; throws CheckpointError saying why it is unusable.
std::string read_latest(const fs::path& root) {
  const auto path = root / kLatest;
  // Read without blocking and only from a regular file: a FIFO would hang.
  std::string text = checkpoint::io::read_regular_file(path.string(), 4096, "checkpoint pointer");
  const auto end = text.find_first_of("\r\n");
  std::string name = text.substr(0, end);
  while (!name.empty() && name.back() == ' ') name.pop_back();
  // Only a step directory's bare name: an absolute path or "../" would resume
  // (and then prune) another run's checkpoints.
  if (!is_step_dir_name(name)) {
    throw CheckpointError(fmt::format("{} does not hold a step directory name like step-00000100 (it must name a "
                                      "checkpoint inside {})",
                                      path.string(), root.string()));
  }
  const auto dir = root / name;
  if (!is_complete(dir)) {
    throw CheckpointError(fmt::format("{} names {}, which is not a complete checkpoint (no {})", path.string(), name,
                                      kTrainState));
  }
  return dir.string();
}

}  // namespace

bool is_step_dir_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 5 + 18) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

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
  const auto steps = step_names(root());
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
  if (!present(fs::path(root()) / kLatest)) return std::nullopt;
  return read_latest(root());
}

std::vector<std::string> CheckpointDirs::complete_steps() const { return complete_step_dirs(root()); }

void CheckpointDirs::require_no_checkpoints() const {
  const auto steps = step_names(root());
  if (steps.empty() && !present(fs::path(root()) / kLatest)) return;
  const std::string held = steps.empty() ? std::string(kLatest)
                                         : fmt::format("{} step director{} ({}{})", steps.size(),
                                                       steps.size() == 1 ? "y" : "ies", steps.back(),
                                                       steps.size() == 1 ? "" : " the newest");
  throw CheckpointError(fmt::format("{} already holds checkpoints of an earlier run: {}. A new run would overwrite "
                                    "and prune them; pass --resume to continue that run, train into another "
                                    "train.output_dir, or remove {} to start over",
                                    root(), held, root()));
}

std::vector<std::string> CheckpointDirs::remove_stale() const {
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(root(), ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    const bool partial = name.ends_with(".partial") && is_step_dir_name(name.substr(0, name.size() - 8));
    const bool temp_latest = name.rfind(std::string(kLatest) + ".tmp.", 0) == 0;
    if (partial || temp_latest) stale.push_back(it->path());
  }
  std::vector<std::string> removed;
  for (const auto& path : stale) {
    try {
      checkpoint::io::remove_tree(path.string());
      removed.push_back(path.string());
    } catch (const CheckpointError&) {
      // Left for the next run: stale debris never stops this one.
    }
  }
  return removed;
}

std::optional<ResumePoint> find_resume_point(const std::string& checkpoints_root) {
  const fs::path root(checkpoints_root);
  std::string why_not_latest;
  if (present(root / kLatest)) {
    try {
      return ResumePoint{.dir = read_latest(root), .note = ""};
    } catch (const CheckpointError& e) {
      why_not_latest = e.what();
    }
  } else {
    why_not_latest = fmt::format("{} has no `latest` file", root.string());
  }
  const auto complete = complete_step_dirs(root);
  if (!complete.empty()) {
    return ResumePoint{.dir = complete.back(),
                       .note = fmt::format("{}; resuming from the newest complete checkpoint, {}", why_not_latest,
                                           fs::path(complete.back()).filename().string())};
  }
  const auto incomplete = step_names(root);
  if (incomplete.empty() && !present(root / kLatest)) return std::nullopt;
  // Starting over here would overwrite these and prune them at the next save.
  throw CheckpointError(fmt::format("--resume: {}, and no step directory in it is complete (with {}){}{}; refusing to "
                                    "start over from step 0 in a folder that holds checkpoints: remove them, or train "
                                    "into another train.output_dir",
                                    why_not_latest, kTrainState, incomplete.empty() ? "" : ": ",
                                    fmt::join(incomplete, ", ")));
}

std::optional<ResumePoint> resolve_resume_dir(const std::string& argument, const CheckpointDirs& dirs) {
  if (argument == "auto" || argument == "latest") return find_resume_point(dirs.root());
  const fs::path path(argument);
  if (!present(path)) {
    throw CheckpointError(fmt::format("--resume {}: no such file or directory; pass a step directory "
                                      "(.../checkpoints/step-00000100), a run directory, or 'auto'",
                                      argument));
  }
  if (present(path / kTrainState)) return ResumePoint{.dir = path.string(), .note = ""};
  for (const auto& root : {path, path / "checkpoints"}) {
    if (!present(root / kLatest) && step_names(root).empty()) continue;
    if (auto point = find_resume_point(root.string())) return point;
  }
  throw CheckpointError(fmt::format("--resume {}: neither a checkpoint (no train_state.json) nor a run directory "
                                    "(no checkpoints/latest or checkpoints/step-N)",
                                    argument));
}

int64_t step_of_dir(const std::string& dir) {
  auto name = fs::path(dir).filename().string();
  if (name.empty()) name = fs::path(dir).parent_path().filename().string();
  if (!is_step_dir_name(name)) {
    throw CheckpointError(fmt::format("{} is not a step directory (expected a name like step-00000100)", dir));
  }
  return std::stoll(name.substr(5));
}

}  // namespace colossus::apps
