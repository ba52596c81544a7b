#include "colossus/metrics/axis_ticks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace colossus::metrics {

namespace {

// The smallest of 1, 2, 5, 10 x 10^k that is >= x (x > 0).
double nice_step(double x) {
  double power = std::pow(10.0, std::floor(std::log10(x)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= x * (1 - 1e-9)) return m * power;
  }
  return 10 * power;
}

// Number of decimals so that ticks `step` apart print distinctly (step = 0.25 -> 2).
int decimals_for(double step) {
  int decimals = 0;
  while (decimals < 12 && std::fabs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) >
                              1e-6 * step * std::pow(10.0, decimals)) {
    ++decimals;
  }
  return decimals;
}

AxisTicks finish(AxisTicks ticks, double step) {
  for (double v : ticks.values) ticks.labels.push_back(tick_label(v, step));
  return ticks;
}

}  // namespace

std::string tick_label(double value, double step) {
  if (std::fabs(value) < step * 1e-9) return "0";
  double magnitude = std::fabs(value);
  if (magnitude >= 1e4) {
    // Steps and token counts: 12.5k, 3M.
    double scale = magnitude >= 1e9 ? 1e9 : magnitude >= 1e6 ? 1e6 : 1e3;
    const char* suffix = scale == 1e9 ? "G" : scale == 1e6 ? "M" : "k";
    return fmt::format("{:.{}f}{}", value / scale, decimals_for(step / scale), suffix);
  }
  if (magnitude < 1e-3) return fmt::format("{:g}", value);  // 1e-05, 2.5e-05
  return fmt::format("{:.{}f}", value, decimals_for(step));
}

AxisTicks linear_ticks(double min, double max, int target) {
  if (!std::isfinite(min) || !std::isfinite(max)) return linear_ticks(0, 1, target);
  if (min > max) std::swap(min, max);
  if (max - min <= std::fabs(max) * 1e-12) {
    double pad = min == 0 ? 1 : std::fabs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  double step = nice_step((max - min) / std::max(target - 1, 1));
  AxisTicks ticks;
  ticks.lo = std::floor(min / step + 1e-9) * step;
  ticks.hi = std::ceil(max / step - 1e-9) * step;
  for (double v = ticks.lo; v <= ticks.hi + step * 1e-6; v += step) {
    // Snap accumulated error (0.30000000000000004) to the tick grid.
    ticks.values.push_back(std::round(v / step) * step);
  }
  return finish(ticks, step);
}

AxisTicks log_ticks(double min, double max) {
  if (!(min > 0) || !(max > 0) || !std::isfinite(min) || !std::isfinite(max)) return log_ticks(1, 10);
  if (min > max) std::swap(min, max);
  int lo_decade = static_cast<int>(std::floor(std::log10(min) + 1e-9));
  int hi_decade = static_cast<int>(std::ceil(std::log10(max) - 1e-9));
  if (hi_decade == lo_decade) ++hi_decade;
  AxisTicks ticks;
  if (hi_decade - lo_decade >= 3) {
    int every = (hi_decade - lo_decade + 7) / 8;  // at most ~8 labels
    ticks.lo = std::pow(10.0, lo_decade);
    ticks.hi = std::pow(10.0, hi_decade);
    for (int d = lo_decade; d <= hi_decade; d += every) ticks.values.push_back(std::pow(10.0, d));
  } else {
    // Within a decade or two: multiples m x 10^k, the axis widened to the nearest ones outside the data.
    for (const std::vector<double>& multiples :
         {std::vector<double>{1, 2, 5}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
      std::vector<double> candidates;
      for (int d = lo_decade; d <= hi_decade; ++d) {
        for (double m : multiples) candidates.push_back(m * std::pow(10.0, d));
      }
      auto below = std::upper_bound(candidates.begin(), candidates.end(), min * (1 + 1e-9));
      auto above = std::lower_bound(candidates.begin(), candidates.end(), max * (1 - 1e-9));
      ticks.lo = below == candidates.begin() ? candidates.front() : *std::prev(below);
      ticks.hi = above == candidates.end() ? candidates.back() : *above;
      ticks.values.clear();
      for (double c : candidates) {
        if (c >= ticks.lo * (1 - 1e-9) && c <= ticks.hi * (1 + 1e-9)) ticks.values.push_back(c);
      }
      if (ticks.values.size() >= 3) break;
    }
  }
  for (double v : ticks.values) ticks.labels.push_back(tick_label(v, v));
  return ticks;
}

}  // namespace colossus::metrics
