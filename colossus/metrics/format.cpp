#include "colossus/metrics/format.h"

#include <fmt/format.h>

#include <array>
#include <cmath>

namespace colossus::metrics {

namespace {

// Three significant digits at any magnitude in [1, 1000).
std::string three_digits(double value) {
  if (value >= 99.95) return fmt::format("{:.0f}", value);
  if (value >= 9.995) return fmt::format("{:.1f}", value);
  return fmt::format("{:.2f}", value);
}

}  // namespace

std::string format_count(double value) {
  if (!std::isfinite(value)) return fmt::format("{}", value);
  if (value < 0) return "-" + format_count(-value);
  if (value < 1000) return value == std::floor(value) ? fmt::format("{:.0f}", value) : three_digits(value);
  static constexpr std::array<const char*, 4> kSuffix{"k", "M", "G", "T"};
  size_t i = 0;
  value /= 1000;
  // 999.96k prints as "1.00M", not "1000k".
  while (value >= 999.95 && i + 1 < kSuffix.size()) {
    value /= 1000;
    ++i;
  }
  return three_digits(value) + kSuffix[i];
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 0) return "-" + format_bytes(-bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr std::array<const char*, 5> kUnit{"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024;
  size_t i = 0;
  while (value >= 1023.95 && i + 1 < kUnit.size()) {
    value /= 1024;
    ++i;
  }
  // One decimal is enough to see growth; three digits before the point need none.
  return value >= 99.95 ? fmt::format("{:.0f} {}", value, kUnit[i]) : fmt::format("{:.1f} {}", value, kUnit[i]);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

std::string format_scalar(double value) {
  if (!std::isfinite(value)) return fmt::format("{}", value);
  double magnitude = std::fabs(value);
  if (magnitude == 0) return "0";
  // Losses and accuracies read best fixed; learning rates and huge values in exponent form.
  if (magnitude >= 1e-2 && magnitude < 1e5) {
    if (magnitude >= 1000) return fmt::format("{:.0f}", value);
    if (magnitude >= 100) return fmt::format("{:.1f}", value);
    if (magnitude >= 10) return fmt::format("{:.2f}", value);
    return fmt::format("{:.3f}", value);
  }
  return fmt::format("{:.1e}", value);
}

}  // namespace colossus::metrics
