// Rank-0 progress display for long work (training steps, tokenising, generation):
// step/total, bar, named fields, tokens/s, memory, elapsed and ETA. Redraws one
// line on a terminal; prints whole lines every so often when stderr is a log.
#pragma once
#include "colossus/core/env.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace colossus::metrics {

struct ProgressBarOptions {
  // Whether this process prints; default: only rank 0 of the launch environment
  // (RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID, as the cluster Logger reads them).
  std::optional<bool> enabled;
  // Redraw one line with '\r' (a terminal) or print whole lines (CI, files,
  // `colossus run` prefixing rank output); default: whether stderr is a TTY.
  std::optional<bool> interactive;
  double redraw_interval_s = 0.1;  // terminal: at most ~10 redraws a second
  int64_t print_every = 0;         // log lines: every this many updates (0: by time only)
  double print_interval_s = 30;    // log lines: and whenever this much time passed (0: never by time)
  int bar_width = 20;              // characters between [ ], terminal only
  // Tokens (or other units) done per step, for the rate; an update can also pass
  // a "tokens" field (units done since the last update) or "tokens_per_s" (a rate).
  int64_t tokens_per_update = 0;
  std::string rate_unit = "tok";
  int64_t initial_step = 0;  // a resumed run starts here, so the first rate and ETA are right
  double smoothing = 0.1;    // weight of the newest step in the moving averages (0, 1]
  bool show_memory = true;
  // Device bytes to show; default: allocated bytes from the device_memory() slot.
  std::function<std::optional<int64_t>()> device_memory_bytes;
  // Where text goes (with its '\r' / '\n'); default: stderr, flushed.
  std::function<void(std::string_view)> sink;
  // Monotonic seconds; tests pass a fake clock.
  std::function<double()> clock;

  void validate() const;
};

// Named numbers shown on the line, in order: {{"loss", 2.31}, {"lr", 3e-4}}.
using ProgressFields = std::vector<std::pair<std::string, double>>;

// Single-threaded: call update() from the loop that does the work.
class ProgressBar {
 public:
  // total <= 0: unknown length (no bar, percentage or ETA).
  ProgressBar(int64_t total, std::string label, ProgressBarOptions options = {});
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `step` is the number of steps done (absolute, not an increment).
  void update(int64_t step, const ProgressFields& fields = {});
  // Prints a line of its own (e.g. an eval result) without tearing the bar.
  void note(std::string_view line);
  // Draws the final state and ends the line; the destructor calls it too.
  void finish();

  bool enabled() const { return enabled_; }
  // The text the next draw would show (no '\r' or '\n'); for tests and custom sinks.
  std::string render() const;

 private:
  void emit(std::string_view text);
  void draw();

  int64_t total_;
  std::string label_;
  ProgressBarOptions options_;
  bool enabled_ = false;
  bool interactive_ = false;
  bool finished_ = false;
  double start_s_ = 0;
  double last_update_s_ = 0;
  double last_draw_s_ = 0;
  int64_t step_ = 0;
  int64_t updates_ = 0;
  bool drawn_since_update_ = false;
  std::optional<double> step_seconds_avg_;  // moving average of seconds per step
  std::optional<double> rate_avg_;          // moving average of units per second
  ProgressFields fields_;
  size_t drawn_width_ = 0;  // length of the line on screen, to blank a longer old one
};

// Whether the launch environment makes this process rank 0 (true when no rank is set).
bool is_rank_zero(const EnvLookup& env);

}  // namespace colossus::metrics
