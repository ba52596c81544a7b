#include "colossus/metrics/metrics_plot.h"

#include "colossus/core/errors.h"
#include "colossus/metrics/jsonl_writer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace colossus::metrics {

std::vector<PlotSeries> series_from_metrics_jsonl(const std::filesystem::path& jsonl_path,
                                                  const std::vector<std::string>& keys, const std::string& x_key) {
  std::vector<PlotSeries> series;
  for (const std::string& key : keys) series.push_back({.name = key});
  for (const nlohmann::json& record : read_metrics_jsonl(jsonl_path)) {
    auto x = record.find(x_key);
    if (x == record.end() || !x->is_number()) continue;
    for (PlotSeries& s : series) {
      // Keys a record lacks (eval loss on most steps) or holds as null (NaN) leave no point.
      auto y = record.find(s.name);
      if (y == record.end() || !y->is_number()) continue;
      s.xs.push_back(x->get<double>());
      s.ys.push_back(y->get<double>());
    }
  }
  return series;
}

void write_metrics_plot_svg(const std::filesystem::path& jsonl_path, const std::filesystem::path& svg_path,
                            const std::vector<std::string>& keys, const PlotOptions& options) {
  std::vector<PlotSeries> series = series_from_metrics_jsonl(jsonl_path, keys);
  bool any = false;
  for (const PlotSeries& s : series) any = any || !s.xs.empty();
  if (!any) {
    throw ConfigError(fmt::format("metrics file '{}' has no numeric values for {} to plot", jsonl_path.string(),
                                  fmt::join(keys, ", ")));
  }
  write_line_plot_svg(svg_path, series, options);
}

}  // namespace colossus::metrics
