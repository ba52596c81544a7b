// Compact human-readable numbers for progress lines and plot labels:
// 1.23M, 2.1 GiB, 3m12s. Pure functions, so the bar's output is testable.
#pragma once
#include <cstdint>
#include <string>

namespace colossus::metrics {

// 950 -> "950", 12345 -> "12.3k", 1.234e6 -> "1.23M" (k, M, G, T; 3 significant digits).
std::string format_count(double value);
// Binary units: 512 -> "512 B", 2254857830 -> "2.1 GiB".
std::string format_bytes(int64_t bytes);
// Seconds as "45s", "3m12s", "1h02m", "2d03h"; negative or non-finite -> "?".
std::string format_duration(double seconds);
// A scalar such as a loss or learning rate: "2.310", "3.0e-04", "1.2e+05".
std::string format_scalar(double value);

}  // namespace colossus::metrics
