#include "colossus/metrics/progress_bar.h"

#include "colossus/core/errors.h"
#include "colossus/metrics/format.h"
#include "colossus/metrics/memory.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace colossus::metrics {

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void write_stderr(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

// Terminal columns, so a redrawn line never wraps ('\r' only returns within one row).
size_t terminal_width() {
  winsize size{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 120;
}

bool is_special_field(const std::string& name) { return name == "tokens" || name == "tokens_per_s"; }

const double* find_field(const ProgressFields& fields, std::string_view name) {
  for (const auto& [key, value] : fields) {
    if (key == name) return &value;
  }
  return nullptr;
}

}  // namespace

bool is_rank_zero(const EnvLookup& env) {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    if (auto value = env(name)) {
      try {
        return std::stoi(*value) == 0;
      } catch (...) {
        // An unparsable rank variable is someone else's error to report; keep looking.
      }
    }
  }
  return true;
}

void ProgressBarOptions::validate() const {
  if (!(redraw_interval_s >= 0)) {
    throw ConfigError(fmt::format("progress redraw_interval_s = {} must be >= 0 (e.g. 0.1)", redraw_interval_s));
  }
  if (print_every < 0)
    throw ConfigError(fmt::format("progress print_every = {} must be >= 0 (0: by time only)", print_every));
  if (!(print_interval_s >= 0)) {
    throw ConfigError(fmt::format("progress print_interval_s = {} must be >= 0 (e.g. 30)", print_interval_s));
  }
  if (bar_width < 0 || bar_width > 200)
    throw ConfigError(fmt::format("progress bar_width = {} must be in [0, 200]", bar_width));
  if (tokens_per_update < 0)
    throw ConfigError(fmt::format("progress tokens_per_update = {} must be >= 0", tokens_per_update));
  if (!(smoothing > 0 && smoothing <= 1)) {
    throw ConfigError(fmt::format("progress smoothing = {} must be in (0, 1] (e.g. 0.1)", smoothing));
  }
}

ProgressBar::ProgressBar(int64_t total, std::string label, ProgressBarOptions options)
    : total_(total), label_(std::move(label)), options_(std::move(options)) {
  options_.validate();
  enabled_ = options_.enabled.value_or(is_rank_zero(process_env()));
  interactive_ = options_.interactive.value_or(::isatty(STDERR_FILENO) == 1);
  if (!options_.clock) options_.clock = steady_seconds;
  if (!options_.sink) options_.sink = write_stderr;
  if (!options_.device_memory_bytes) {
    options_.device_memory_bytes = []() -> std::optional<int64_t> {
      if (auto memory = device_memory()) return memory->allocated_bytes;
      return std::nullopt;
    };
  }
  start_s_ = last_update_s_ = last_draw_s_ = options_.clock();
  step_ = options_.initial_step;
}

ProgressBar::~ProgressBar() {
  try {
    finish();
  } catch (...) {
    // A failing sink must not terminate the program from a destructor.
  }
}

void ProgressBar::update(int64_t step, const ProgressFields& fields) {
  if (!enabled_ || finished_) return;
  double now = options_.clock();
  double dt = now - last_update_s_;
  int64_t steps = step - step_;
  double a = options_.smoothing;
  auto blend = [a](std::optional<double>& average, double sample) {
    average = average ? (1 - a) * *average + a * sample : sample;
  };
  if (steps > 0 && dt > 0) blend(step_seconds_avg_, dt / static_cast<double>(steps));
  if (const double* rate = find_field(fields, "tokens_per_s")) {
    rate_avg_ = *rate;  // the caller measured it; show as given
  } else if (dt > 0) {
    const double* tokens = find_field(fields, "tokens");
    if (tokens != nullptr) {
      blend(rate_avg_, *tokens / dt);
    } else if (options_.tokens_per_update > 0 && steps > 0) {
      blend(rate_avg_, static_cast<double>(options_.tokens_per_update * steps) / dt);
    }
  }
  step_ = step;
  last_update_s_ = now;
  fields_ = fields;
  ++updates_;
  drawn_since_update_ = false;

  bool done = total_ > 0 && step >= total_;
  bool due = false;
  if (interactive_) {
    due = updates_ == 1 || done || now - last_draw_s_ >= options_.redraw_interval_s;
  } else {
    due = updates_ == 1 || done || (options_.print_every > 0 && updates_ % options_.print_every == 0) ||
          (options_.print_interval_s > 0 && now - last_draw_s_ >= options_.print_interval_s);
  }
  if (due) {
    last_draw_s_ = now;
    draw();
  }
}

void ProgressBar::note(std::string_view line) {
  if (!enabled_) return;
  if (interactive_ && drawn_width_ > 0) {
    // Blank the bar, print the note on its own line, then put the bar back under it.
    emit("\r" + std::string(drawn_width_, ' ') + "\r");
    drawn_width_ = 0;
    emit(std::string(line) + "\n");
    if (!finished_ && updates_ > 0) draw();
    return;
  }
  emit(std::string(line) + "\n");
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (updates_ == 0) return;
  if (interactive_) {
    draw();
    emit("\n");
  } else if (!drawn_since_update_) {
    draw();
  }
}

void ProgressBar::emit(std::string_view text) { options_.sink(text); }

void ProgressBar::draw() {
  drawn_since_update_ = true;
  std::string line = render();
  if (!interactive_) {
    emit(line + "\n");
    return;
  }
  size_t width = terminal_width() - 1;
  if (line.size() > width) line.resize(width);
  size_t shown = line.size();
  if (shown < drawn_width_) line.append(drawn_width_ - shown, ' ');
  drawn_width_ = shown;
  emit("\r" + line);
}

std::string ProgressBar::render() const {
  std::string out = label_.empty() ? std::string() : label_ + " ";
  double elapsed = last_update_s_ - start_s_;
  if (total_ > 0) {
    double fraction = std::clamp(static_cast<double>(step_) / static_cast<double>(total_), 0.0, 1.0);
    out += fmt::format("{}/{}", step_, total_);
    if (interactive_ && options_.bar_width > 0) {
      auto filled = static_cast<int>(fraction * options_.bar_width);
      std::string bar(static_cast<size_t>(options_.bar_width), ' ');
      std::fill_n(bar.begin(), filled, '=');
      if (filled < options_.bar_width) bar[static_cast<size_t>(filled)] = '>';
      out += " [" + bar + "]";
    }
    out += fmt::format(" {:.0f}%", std::floor(fraction * 100));
  } else {
    out += fmt::format("{}", step_);
  }

  std::string shown_fields;
  for (const auto& [name, value] : fields_) {
    if (is_special_field(name)) continue;
    shown_fields += fmt::format("{}{} {}", shown_fields.empty() ? "" : " ", name, format_scalar(value));
  }
  if (!shown_fields.empty()) out += " | " + shown_fields;
  if (rate_avg_) out += fmt::format(" | {} {}/s", format_count(*rate_avg_), options_.rate_unit);

  if (options_.show_memory) {
    out += " | mem " + format_bytes(host_rss_bytes());
    if (auto device_bytes = options_.device_memory_bytes()) out += " dev " + format_bytes(*device_bytes);
  }

  std::string eta;
  if (total_ > 0 && step_seconds_avg_) {
    eta = format_duration(static_cast<double>(std::max<int64_t>(total_ - step_, 0)) * *step_seconds_avg_);
  }
  if (interactive_) {
    out += " | " + format_duration(std::floor(elapsed)) + (eta.empty() ? "" : "<" + eta);
  } else {
    out += " | elapsed " + format_duration(std::floor(elapsed)) + (eta.empty() ? "" : " eta " + eta);
  }
  return out;
}

}  // namespace colossus::metrics
