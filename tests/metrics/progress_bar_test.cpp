// Progress bar with a fake clock and a captured sink: log-line and terminal
// modes, throttling, rates, ETA, memory and rank gating.
#include "colossus/metrics/progress_bar.h"

#include "colossus/core/errors.h"
#include "colossus/metrics/memory.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace colossus::metrics {

namespace {

// A bar whose clock and output the test controls.
struct Harness {
  double now = 100;
  std::string out;
  ProgressBarOptions options(bool interactive) {
    return {.enabled = true,
            .interactive = interactive,
            .show_memory = false,
            .sink = [this](std::string_view text) { out += text; },
            .clock = [this] { return now; }};
  }
};

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  size_t start = 0;
  for (size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', start)) {
    result.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return result;
}

}  // namespace

TEST(ProgressBar, LogModePrintsEveryN) {
  Harness h;
  auto options = h.options(false);
  options.print_every = 5;
  options.print_interval_s = 0;
  options.tokens_per_update = 1000;
  {
    ProgressBar bar(20, "train", options);
    for (int step = 1; step <= 20; ++step) {
      h.now += 0.5;  // 2 steps/s -> 2000 tok/s
      bar.update(step, {{"loss", 3.0 - 0.1 * step}, {"lr", 3e-4}});
    }
  }
  auto printed = lines(h.out);
  // The first update, then every 5th (5, 10, 15, 20; 20 is also the end).
  ASSERT_EQ(printed.size(), 5u) << h.out;
  EXPECT_EQ(h.out.find('\r'), std::string::npos);
  EXPECT_EQ(printed[0], "train 1/20 5% | loss 2.900 lr 3.0e-04 | 2.00k tok/s | elapsed 0s eta 10s");
  EXPECT_EQ(printed[2], "train 10/20 50% | loss 2.000 lr 3.0e-04 | 2.00k tok/s | elapsed 5s eta 5s");
  EXPECT_EQ(printed[4], "train 20/20 100% | loss 1.000 lr 3.0e-04 | 2.00k tok/s | elapsed 10s eta 0s");
}

TEST(ProgressBar, LogModePrintsByTimeAndOnFinish) {
  Harness h;
  auto options = h.options(false);
  options.print_interval_s = 10;
  ProgressBar bar(0, "tokenize", options);  // unknown total
  for (int step = 1; step <= 25; ++step) {
    h.now += 1;
    bar.update(step, {{"tokens", 500}});
  }
  bar.finish();
  bar.finish();  // idempotent
  auto printed = lines(h.out);
  // Step 1, then once 10 s passed (11, 21), then the unprinted final state (25).
  ASSERT_EQ(printed.size(), 4u) << h.out;
  EXPECT_EQ(printed[1], "tokenize 11 | 500 tok/s | elapsed 11s");
  EXPECT_TRUE(printed[3].starts_with("tokenize 25 ")) << printed[3];
}

TEST(ProgressBar, TerminalRedrawsOneLineThrottled) {
  Harness h;
  auto options = h.options(true);
  options.bar_width = 10;
  {
    ProgressBar bar(100, "gen", options);
    for (int step = 1; step <= 100; ++step) {
      h.now += 0.01;  // 100 updates/s, redrawn at most 10/s
      bar.update(step, {{"tokens_per_s", 1.5e6}});
    }
  }
  size_t redraws = 0;
  for (char c : h.out) redraws += c == '\r' ? 1 : 0;
  // First update, ~every 10th, the final step, and the final draw in finish().
  EXPECT_GE(redraws, 10u);
  EXPECT_LE(redraws, 14u);
  EXPECT_EQ(lines(h.out).size(), 1u);  // one newline, at the end
  EXPECT_TRUE(h.out.ends_with("\n"));
  size_t last = h.out.rfind('\r');
  std::string final_line = h.out.substr(last + 1);
  EXPECT_TRUE(final_line.starts_with("gen 100/100 [==========] 100% | 1.50M tok/s | 1s<0s")) << final_line;
}

TEST(ProgressBar, TerminalBlanksLongerOldLine) {
  Harness h;
  auto options = h.options(true);
  options.redraw_interval_s = 0;
  ProgressBar bar(10, "x", options);
  bar.update(1, {{"a_long_field_name", 1.0}});
  bar.update(2);
  size_t second = h.out.rfind('\r');
  std::string first_line = h.out.substr(1, second - 1);
  // The shorter second line is padded to cover the first one.
  EXPECT_EQ(h.out.size() - second - 1, first_line.size());
  bar.note("eval loss 2.1");
  EXPECT_NE(h.out.find("eval loss 2.1\n"), std::string::npos);
}

TEST(ProgressBar, EtaFromMovingAverage) {
  Harness h;
  auto options = h.options(false);
  options.print_interval_s = 0;
  options.smoothing = 0.5;
  ProgressBar bar(1000, "", options);
  h.now += 1;
  bar.update(1);  // 1 s/step
  h.now += 3;
  bar.update(2);                                                 // average 0.5 * 1 + 0.5 * 3 = 2 s/step
  EXPECT_EQ(bar.render(), "2/1000 0% | elapsed 4s eta 33m16s");  // 998 steps * 2 s
}

TEST(ProgressBar, ResumedRunCountsFromInitialStep) {
  Harness h;
  auto options = h.options(false);
  options.initial_step = 500;
  options.tokens_per_update = 100;
  ProgressBar bar(1000, "train", options);
  h.now += 2;
  bar.update(510);  // 10 steps in 2 s
  EXPECT_EQ(bar.render(), "train 510/1000 51% | 500 tok/s | elapsed 2s eta 1m38s");
}

TEST(ProgressBar, ShowsHostAndDeviceMemory) {
  Harness h;
  auto options = h.options(false);
  options.show_memory = true;
  options.device_memory_bytes = [] { return std::optional<int64_t>(int64_t{3} << 30); };
  ProgressBar bar(10, "m", options);
  bar.update(1);
  EXPECT_NE(h.out.find(" | mem "), std::string::npos) << h.out;
  EXPECT_NE(h.out.find(" dev 3.0 GiB"), std::string::npos) << h.out;

  // The default device source is the process-wide probe slot.
  set_device_memory_probe([] { return std::optional<DeviceMemory>(DeviceMemory{.allocated_bytes = 5 << 20}); });
  Harness h2;
  auto slot_options = h2.options(false);
  slot_options.show_memory = true;
  ProgressBar slot_bar(10, "m", slot_options);
  slot_bar.update(1);
  set_device_memory_probe(nullptr);
  EXPECT_NE(h2.out.find(" dev 5.0 MiB"), std::string::npos) << h2.out;
}

// The peak-reset slot beside the probe: a reset starts a new peak (what
// Gemini's warm-up trace reads per stretch), and the peak it cleared is
// carried into max_allocated_bytes, so "since start" reports stay whole.
TEST(DeviceMemorySlot, PeakResetCarriesThePeakItClears) {
  struct Fake {
    int64_t allocated = 0, peak = 0;
  };
  auto fake = std::make_shared<Fake>();
  EXPECT_FALSE(device_memory_peak_resettable());
  reset_device_memory_peak();  // none installed: nothing happens
  set_device_memory_probe([fake] {
    return std::optional<DeviceMemory>(DeviceMemory{.allocated_bytes = fake->allocated, .peak_allocated_bytes = fake->peak});
  });
  set_device_memory_peak_reset([fake] { fake->peak = fake->allocated; });
  EXPECT_TRUE(device_memory_peak_resettable());
  *fake = {.allocated = 10, .peak = 100};
  EXPECT_EQ(device_memory()->max_allocated_bytes, 100);
  reset_device_memory_peak();
  fake->peak = 40;  // a smaller stretch after the reset
  EXPECT_EQ(device_memory()->peak_allocated_bytes, 40);
  EXPECT_EQ(device_memory()->max_allocated_bytes, 100) << "the cleared peak is carried";
  fake->peak = 150;
  EXPECT_EQ(device_memory()->max_allocated_bytes, 150);
  set_device_memory_peak_reset(nullptr);
  set_device_memory_probe(nullptr);
  EXPECT_FALSE(device_memory_peak_resettable());
}

TEST(ProgressBar, OnlyRankZeroPrints) {
  EXPECT_TRUE(is_rank_zero(map_env({})));
  EXPECT_TRUE(is_rank_zero(map_env({{"RANK", "0"}})));
  EXPECT_FALSE(is_rank_zero(map_env({{"RANK", "3"}})));
  EXPECT_FALSE(is_rank_zero(map_env({{"OMPI_COMM_WORLD_RANK", "1"}})));
  Harness h;
  auto options = h.options(false);
  options.enabled = false;
  ProgressBar bar(10, "quiet", options);
  bar.update(10);
  bar.note("nothing");
  bar.finish();
  EXPECT_TRUE(h.out.empty());
  EXPECT_FALSE(bar.enabled());
}

TEST(ProgressBar, ValidatesOptions) {
  EXPECT_THROW(ProgressBar(10, "x", {.smoothing = 0}), ConfigError);
  EXPECT_THROW(ProgressBar(10, "x", {.print_every = -1}), ConfigError);
  EXPECT_THROW(ProgressBar(10, "x", {.bar_width = -2}), ConfigError);
}

TEST(Memory, HostRss) {
  int64_t rss = host_rss_bytes();
  EXPECT_GT(rss, int64_t{1} << 20);  // a gtest binary linked with torch is well over 1 MiB
  EXPECT_GE(host_peak_rss_bytes(), rss);
  EXPECT_FALSE(device_memory().has_value());
}

}  // namespace colossus::metrics
