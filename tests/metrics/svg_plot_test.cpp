// SVG plots: tick choice, and documents that a real XML parser reads with the
// expected polylines (point counts) and labels; plots from a metrics JSONL file.
#include "colossus/metrics/svg_plot.h"

#include "colossus/core/errors.h"
#include "colossus/metrics/axis_ticks.h"
#include "colossus/metrics/jsonl_writer.h"
#include "colossus/metrics/metrics_plot.h"
#include "tests/metrics/test_support.h"

#include <gtest/gtest.h>

#include <cmath>

namespace colossus::metrics {

namespace fs = std::filesystem;
using testing::run_oracle;
using testing::scratch_dir;

namespace {

bool has_text(const nlohmann::json& svg, const std::string& text) {
  for (const auto& t : svg.at("texts")) {
    if (t == text) return true;
  }
  return false;
}

}  // namespace

TEST(AxisTicks, Linear) {
  AxisTicks t = linear_ticks(0, 1000);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 1000);
  EXPECT_EQ(t.labels, (std::vector<std::string>{"0", "200", "400", "600", "800", "1000"}));
  t = linear_ticks(2.13, 10.87);
  EXPECT_EQ(t.lo, 2);
  EXPECT_EQ(t.hi, 12);
  EXPECT_EQ(t.labels.front(), "2");
  t = linear_ticks(0.1, 0.35);
  EXPECT_EQ(t.labels, (std::vector<std::string>{"0.10", "0.15", "0.20", "0.25", "0.30", "0.35"}));
  t = linear_ticks(0, 125000);
  EXPECT_EQ(t.labels, (std::vector<std::string>{"0", "50k", "100k", "150k"}));
  t = linear_ticks(3, 3);  // constant series
  EXPECT_LT(t.lo, 3);
  EXPECT_GT(t.hi, 3);
  EXPECT_EQ(tick_label(12500, 2500), "12.5k");
  EXPECT_EQ(tick_label(3e-5, 1e-5), "3e-05");
}

TEST(AxisTicks, Log) {
  AxisTicks t = log_ticks(2.9, 10.9);
  EXPECT_EQ(t.lo, 2);
  EXPECT_EQ(t.hi, 20);
  EXPECT_EQ(t.labels, (std::vector<std::string>{"2", "5", "10", "20"}));
  t = log_ticks(1e-5, 3e-2);
  EXPECT_EQ(t.labels, (std::vector<std::string>{"1e-05", "0.0001", "0.001", "0.01", "0.1"}));
  t = log_ticks(2.95, 3.05);  // narrow: 1..9 multiples
  EXPECT_GE(t.values.size(), 2u);
  EXPECT_LE(t.lo, 2.95);
  EXPECT_GE(t.hi, 3.05);
}

TEST(SvgPlot, WellFormedWithPointsAndLabels) {
  PlotSeries train{.name = "train <loss>"};
  for (int step = 1; step <= 200; ++step) {
    train.xs.push_back(step);
    train.ys.push_back(2 + 8 * std::exp(-step / 40.0));
  }
  train.ys[50] = NAN;  // skipped, not drawn at 0
  PlotSeries eval{.name = "eval", .xs = {50, 100, 150, 200}, .ys = {4.1, 3.0, 2.5, 2.3}};
  fs::path path = scratch_dir() / "plots" / "loss.svg";
  write_line_plot_svg(path, {train, eval}, {.title = "GPT-2 & loss", .y_label = "loss"});
  nlohmann::json svg = run_oracle("svg", path);
  ASSERT_TRUE(svg.is_object());
  EXPECT_EQ(svg.at("root"), "{http://www.w3.org/2000/svg}svg");
  EXPECT_EQ(svg.at("polylines"), nlohmann::json::parse("[199, 4]"));
  EXPECT_TRUE(has_text(svg, "GPT-2 & loss"));
  EXPECT_TRUE(has_text(svg, "train <loss>"));
  EXPECT_TRUE(has_text(svg, "eval"));
  EXPECT_TRUE(has_text(svg, "step"));
  EXPECT_TRUE(has_text(svg, "loss"));
  EXPECT_TRUE(has_text(svg, "200"));  // an x tick
  EXPECT_TRUE(has_text(svg, "10"));   // a y tick
}

TEST(SvgPlot, LogAxisAndThinning) {
  PlotSeries s{.name = "lr"};
  for (int i = 0; i < 100000; ++i) {
    s.xs.push_back(i);
    s.ys.push_back(i == 0 ? 0.0 : 1e-3 * std::pow(0.9999, i));  // 0 cannot go on a log axis
  }
  std::string svg = render_line_plot_svg({s}, {.y_label = "lr", .log_y = true});
  fs::path path = scratch_dir() / "lr.svg";
  write_line_plot_svg(path, {s}, {.y_label = "lr", .log_y = true});
  nlohmann::json parsed = run_oracle("svg", path);
  ASSERT_TRUE(parsed.is_object());
  ASSERT_EQ(parsed.at("polylines").size(), 1u);
  // 99999 points thinned to at most 4 per pixel column of a ~700 px wide plot.
  int points = parsed.at("polylines")[0].get<int>();
  EXPECT_GT(points, 700);
  EXPECT_LE(points, 4 * 710);
  EXPECT_TRUE(has_text(parsed, "lr (log)"));
  EXPECT_LT(svg.size(), size_t{200000});
}

TEST(SvgPlot, EmptyAndErrors) {
  std::string svg = render_line_plot_svg({}, {.title = "nothing yet"});
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_THROW(render_line_plot_svg({{.name = "bad", .xs = {1, 2}, .ys = {1}}}, {}), ConfigError);
  EXPECT_THROW(render_line_plot_svg({}, {.width = 10}), ConfigError);
}

TEST(MetricsPlot, FromJsonl) {
  fs::path jsonl = scratch_dir() / "plot_metrics.jsonl";
  {
    MetricsWriter writer(jsonl);
    for (int64_t step = 1; step <= 30; ++step) {
      writer.write(step, {{"loss", 5.0 / static_cast<double>(step)}, {"lr", 1e-3}});
      if (step % 10 == 0) writer.write(step, {{"eval_loss", 6.0 / static_cast<double>(step)}});
    }
  }
  auto series = series_from_metrics_jsonl(jsonl, {"loss", "eval_loss"});
  ASSERT_EQ(series.size(), 2u);
  EXPECT_EQ(series[0].xs.size(), 30u);
  EXPECT_EQ(series[1].xs, (std::vector<double>{10, 20, 30}));
  fs::path svg_path = scratch_dir() / "plot_metrics.svg";
  write_metrics_plot_svg(jsonl, svg_path, {"loss", "eval_loss"}, {.title = "loss", .y_label = "loss"});
  nlohmann::json svg = run_oracle("svg", svg_path);
  ASSERT_TRUE(svg.is_object());
  EXPECT_EQ(svg.at("polylines"), nlohmann::json::parse("[30, 3]"));
  EXPECT_TRUE(has_text(svg, "eval_loss"));
  EXPECT_THROW(write_metrics_plot_svg(jsonl, svg_path, {"accuracy"}), ConfigError);
}

}  // namespace colossus::metrics
