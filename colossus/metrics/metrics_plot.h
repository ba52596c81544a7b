// Plots chosen keys of a metrics JSONL file (MetricsWriter's) against step, e.g.
// loss.svg with train and eval loss at the end of a run.
#pragma once
#include "colossus/metrics/svg_plot.h"

#include <filesystem>
#include <string>
#include <vector>

namespace colossus::metrics {

// One series per key: (record[x_key], record[key]) for each record holding both as numbers.
std::vector<PlotSeries> series_from_metrics_jsonl(const std::filesystem::path& jsonl_path,
                                                  const std::vector<std::string>& keys,
                                                  const std::string& x_key = "step");

// Writes the SVG (atomically). Throws ConfigError when none of `keys` has a value in the file.
void write_metrics_plot_svg(const std::filesystem::path& jsonl_path, const std::filesystem::path& svg_path,
                            const std::vector<std::string>& keys, const PlotOptions& options = {});

}  // namespace colossus::metrics
