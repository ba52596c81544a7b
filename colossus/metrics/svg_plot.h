// Line charts as standalone SVG (axes with nice ticks, grid, legend, optional
// log y), so a run can leave loss.svg behind: no plotting dependencies.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace colossus::metrics {

struct PlotSeries {
  std::string name;  // legend entry
  std::vector<double> xs;
  std::vector<double> ys;  // same length as xs; non-finite points (and <= 0 on a log axis) are skipped
};

struct PlotOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label;
  bool log_y = false;
  int width = 800;  // pixels
  int height = 450;

  void validate() const;
};

// The SVG document. A series of more points than the plot has pixel columns is
// thinned to each column's first, lowest, highest and last point, which draws
// the same picture in a file of bounded size.
std::string render_line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options);
// Renders and writes atomically (temp file + rename), creating parent folders.
void write_line_plot_svg(const std::filesystem::path& path, const std::vector<PlotSeries>& series,
                         const PlotOptions& options);

}  // namespace colossus::metrics
