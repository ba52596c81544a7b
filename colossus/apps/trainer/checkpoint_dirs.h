// Where a run keeps its checkpoints: OUTPUT_DIR/checkpoints/step-00000100/
// (model/ as a Hugging Face directory, optimizer/, lr_scheduler.json,
// train_state.json, rng/) and a `latest` file naming the newest complete one.
// A checkpoint is written under step-N.partial/ and renamed into place only
// when every rank has finished, then `latest` is replaced atomically, so a
// crash at any point leaves the previous checkpoint loadable and `latest`
// never names a half-written one. Resuming never silently starts over: a
// missing or unusable `latest` falls back to the newest complete step
// directory, and step directories without a complete one are an error.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace colossus::apps {

struct CheckpointDirs {
  explicit CheckpointDirs(std::string output_dir);

  std::string root() const;                        // OUTPUT_DIR/checkpoints
  std::string step_dir(int64_t step) const;        // .../step-00000100
  std::string partial_dir(int64_t step) const;     // .../step-00000100.partial
  // Renames partial -> final (replacing an older final of the same step),
  // points `latest` at it and removes all but the newest `keep_last` step
  // directories (0 keeps all). Rank 0 only, after every rank has written.
  void publish(int64_t step, int64_t keep_last) const;
  // The checkpoint `latest` names, if there is a `latest` file. Throws
  // CheckpointError unless it holds one `step-N` name (no path: nothing
  // outside this folder) of a complete step directory (with train_state.json).
  std::optional<std::string> latest() const;
  // Complete step directories (those with train_state.json), oldest first.
  std::vector<std::string> complete_steps() const;
  // Throws CheckpointError when the folder holds a step directory or a
  // `latest` file: a fresh run (no --resume) would overwrite and prune the
  // checkpoints of an earlier run, so it is refused, naming the ways out.
  void require_no_checkpoints() const;
  // Removes what crashed runs leave: step-N.partial/ directories and
  // latest.tmp.* files. Rank 0, at the start of a run, before any save.
  // Returns what it removed.
  std::vector<std::string> remove_stale() const;

 private:
  std::string output_dir_;
};

// Where a resumed run continues from: the step directory, and when that is
// not what `latest` names, why (for the log).
struct ResumePoint {
  std::string dir;
  std::string note;  // empty when `latest` was used
};

// The resume point within a checkpoints folder: `latest` when usable, else
// the newest complete step directory (with the reason in `note`); nullopt
// when the folder has no checkpoints at all. Throws CheckpointError when it
// has step directories or a `latest` file but no complete checkpoint, since
// starting over would overwrite and prune them.
std::optional<ResumePoint> find_resume_point(const std::string& checkpoints_root);

// The step directory a --resume argument means: "auto"/"latest" (the run's
// resume point, nullopt if the run has no checkpoints), a step directory, or
// a run/checkpoints directory. Throws CheckpointError naming what was looked for.
std::optional<ResumePoint> resolve_resume_dir(const std::string& argument, const CheckpointDirs& dirs);

// Step number of a "step-00000100" directory name (CheckpointError otherwise).
int64_t step_of_dir(const std::string& dir);
// True for "step-" followed by digits only.
bool is_step_dir_name(const std::string& name);

}  // namespace colossus::apps
