// "Nice" axis ranges and tick values for plots (1, 2, 5 x 10^k steps; decades on
// a log axis) and tick labels that show just the digits the step needs.
#pragma once
#include <string>
#include <vector>

namespace colossus::metrics {

struct AxisTicks {
  double lo = 0;  // the axis spans [lo, hi], widened from the data to tick values
  double hi = 1;
  std::vector<double> values;
  std::vector<std::string> labels;
};

// About `target` ticks covering [min, max]; min == max is widened around the value.
AxisTicks linear_ticks(double min, double max, int target = 6);
// Ticks for a log axis over [min, max], both > 0: decades when the data spans
// several, else 1-2-5 (or 1..9) multiples so a short range still gets 3+ ticks.
AxisTicks log_ticks(double min, double max);

// Label for a tick `value` on an axis whose ticks are `step` apart: 0.25, 1500, 12.5k, 3M, 1e-05.
std::string tick_label(double value, double step);

}  // namespace colossus::metrics
