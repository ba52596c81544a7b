// Where a run keeps its checkpoints: OUTPUT_DIR/checkpoints/step-00000100/
// (model/ as a Hugging Face directory, optimizer/, lr_scheduler.json,
// train_state.json, rng/) and a `latest` file naming the newest complete one.
// A checkpoint is written under step-N.partial/ and renamed into place only
// when every rank has finished, then `latest` is replaced atomically, so a
// crash at any point leaves the previous checkpoint loadable and `latest`
// never names a half-written one.
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
  // The newest complete checkpoint named by `latest`, if any.
  std::optional<std::string> latest() const;

 private:
  std::string output_dir_;
};

// The step directory a --resume argument means: "auto"/"latest" (the run's
// latest, nullopt if none), a step directory, or a run/checkpoints directory
// holding a `latest` file. Throws CheckpointError naming what was looked for.
std::optional<std::string> resolve_resume_dir(const std::string& argument, const CheckpointDirs& dirs);

// Step number of a "step-00000100" directory name (CheckpointError otherwise).
int64_t step_of_dir(const std::string& dir);

}  // namespace colossus::apps
