#include "colossus/metrics/svg_plot.h"

#include "colossus/core/errors.h"
#include "colossus/metrics/atomic_file.h"
#include "colossus/metrics/axis_ticks.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

namespace colossus::metrics {

namespace {

// Distinct on white and for the common colour-vision deficiencies (the tab10 order).
constexpr std::array<const char*, 8> kColours{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                              "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

std::string escape_xml(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

struct Point {
  double x;
  double y;
};

// The points that can be drawn, sorted by x.
std::vector<Point> drawable_points(const PlotSeries& s, bool log_y) {
  std::vector<Point> points;
  for (size_t i = 0; i < s.xs.size(); ++i) {
    double x = s.xs[i];
    double y = s.ys[i];
    if (!std::isfinite(x) || !std::isfinite(y) || (log_y && y <= 0)) continue;
    points.push_back({x, y});
  }
  std::stable_sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
  return points;
}

// Pixel-space thinning: per pixel column keep first, min, max and last, in x order.
std::vector<Point> thin_to_columns(const std::vector<Point>& pixels, size_t columns) {
  if (pixels.size() <= 2 * columns) return pixels;
  std::vector<Point> out;
  size_t i = 0;
  while (i < pixels.size()) {
    size_t j = i;
    auto column = static_cast<long>(std::floor(pixels[i].x));
    size_t lo = i;
    size_t hi = i;
    while (j < pixels.size() && static_cast<long>(std::floor(pixels[j].x)) == column) {
      if (pixels[j].y < pixels[lo].y) lo = j;
      if (pixels[j].y > pixels[hi].y) hi = j;
      ++j;
    }
    std::array<size_t, 4> keep{i, std::min(lo, hi), std::max(lo, hi), j - 1};
    for (size_t k = 0; k < keep.size(); ++k) {
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(pixels[keep[k]]);
    }
    i = j;
  }
  return out;
}

}  // namespace

void PlotOptions::validate() const {
  if (width < 200 || width > 10000)
    throw ConfigError(fmt::format("plot width = {} must be in [200, 10000] pixels", width));
  if (height < 150 || height > 10000) {
    throw ConfigError(fmt::format("plot height = {} must be in [150, 10000] pixels", height));
  }
}

std::string render_line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  options.validate();
  std::vector<std::vector<Point>> data;
  double x_min = std::numeric_limits<double>::infinity();
  double x_max = -x_min;
  double y_min = x_min;
  double y_max = -x_min;
  for (const PlotSeries& s : series) {
    if (s.xs.size() != s.ys.size()) {
      throw ConfigError(
          fmt::format("plot series '{}' has {} x values but {} y values", s.name, s.xs.size(), s.ys.size()));
    }
    data.push_back(drawable_points(s, options.log_y));
    for (const Point& p : data.back()) {
      x_min = std::min(x_min, p.x);
      x_max = std::max(x_max, p.x);
      y_min = std::min(y_min, p.y);
      y_max = std::max(y_max, p.y);
    }
  }
  bool empty = !std::isfinite(x_min);
  if (empty) {
    x_min = 0;
    x_max = 1;
    y_min = options.log_y ? 1 : 0;
    y_max = options.log_y ? 10 : 1;
  }
  AxisTicks x_ticks = linear_ticks(x_min, x_max);
  AxisTicks y_ticks = options.log_y ? log_ticks(y_min, y_max) : linear_ticks(y_min, y_max);

  // Layout in pixels: room for tick labels left and below, the title above.
  const double left = 72;
  const double right = options.width - 20.0;
  const double top = options.title.empty() ? 20.0 : 44.0;
  const double bottom = options.height - 52.0;
  auto px = [&](double x) { return left + (x - x_ticks.lo) / (x_ticks.hi - x_ticks.lo) * (right - left); };
  auto py = [&](double y) {
    double t = options.log_y
                   ? (std::log10(y) - std::log10(y_ticks.lo)) / (std::log10(y_ticks.hi) - std::log10(y_ticks.lo))
                   : (y - y_ticks.lo) / (y_ticks.hi - y_ticks.lo);
    return bottom - t * (bottom - top);
  };

  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      options.width, options.height);
  if (!options.title.empty()) {
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
        (left + right) / 2, escape_xml(options.title));
  }

  // Grid and tick labels.
  svg += "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  for (double v : x_ticks.values)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", px(v), top, bottom);
  for (double v : y_ticks.values)
    svg += fmt::format("<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\"/>\n", py(v), left, right);
  svg += "</g>\n<g fill=\"#333\">\n";
  for (size_t i = 0; i < x_ticks.values.size(); ++i) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(x_ticks.values[i]),
                       bottom + 17, escape_xml(x_ticks.labels[i]));
  }
  for (size_t i = 0; i < y_ticks.values.size(); ++i) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 7,
                       py(y_ticks.values[i]) + 4, escape_xml(y_ticks.labels[i]));
  }
  svg += "</g>\n";
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#555\"/>\n", left, top,
      right - left, bottom - top);
  if (!options.x_label.empty()) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\">{}</text>\n",
                       (left + right) / 2, static_cast<double>(options.height) - 12, escape_xml(options.x_label));
  }
  if (!options.y_label.empty()) {
    double cy = (top + bottom) / 2;
    svg += fmt::format(
        "<text x=\"16\" y=\"{0:.1f}\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 16 "
        "{0:.1f})\">{1}</text>\n",
        cy, escape_xml(options.y_label + (options.log_y ? " (log)" : "")));
  }
  if (empty) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n",
                       (left + right) / 2, (top + bottom) / 2);
  }

  // Series: a polyline each; sparse series (an eval every N steps) also get dots.
  for (size_t i = 0; i < data.size(); ++i) {
    const char* colour = kColours[i % kColours.size()];
    std::vector<Point> pixels;
    for (const Point& p : data[i]) pixels.push_back({px(p.x), py(p.y)});
    pixels = thin_to_columns(pixels, static_cast<size_t>(right - left));
    if (pixels.empty()) continue;
    std::string points;
    for (const Point& p : pixels) points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", p.x, p.y);
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"{}\"/>\n",
        colour, points);
    if (pixels.size() <= 40) {
      svg += fmt::format("<g fill=\"{}\">\n", colour);
      for (const Point& p : pixels) svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\"/>\n", p.x, p.y);
      svg += "</g>\n";
    }
  }

  // Legend in the top-right corner, where falling curves (loss) leave room.
  if (!series.empty()) {
    size_t longest = 0;
    for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
    double box_width = 38 + 7.0 * static_cast<double>(longest);
    double box_height = 8 + 18.0 * static_cast<double>(series.size());
    double bx = right - box_width - 8;
    double by = top + 8;
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"white\" fill-opacity=\"0.85\" "
        "stroke=\"#bbb\"/>\n",
        bx, by, box_width, box_height);
    for (size_t i = 0; i < series.size(); ++i) {
      double ly = by + 4 + 18.0 * static_cast<double>(i) + 9;
      svg += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2.5\"/>\n",
          bx + 8, ly, bx + 28, ly, kColours[i % kColours.size()]);
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#222\">{}</text>\n", bx + 34, ly + 4,
                         escape_xml(series[i].name));
    }
  }
  svg += "</svg>\n";
  return svg;
}

void write_line_plot_svg(const std::filesystem::path& path, const std::vector<PlotSeries>& series,
                         const PlotOptions& options) {
  write_file_atomically(path, render_line_plot_svg(series, options));
}

}  // namespace colossus::metrics
