// DynamicLossScaler sequences (Colossal-AI semantics), unscale-and-check.
#include "colossus/amp/loss_scaler.h"
#include "colossus/amp/unscale.h"
#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

namespace colossus::amp {
namespace {

TEST(DynamicLossScaler, DefaultsAreColossalAis) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 1000);
  EXPECT_EQ(s.options().hysteresis, 2);
  EXPECT_EQ(s.options().min_scale, 1.0);
  EXPECT_EQ(s.options().max_scale, 16777216.0);
}

TEST(DynamicLossScaler, HysteresisDelaysBackoffThenEveryOverflowBacksOff) {
  DynamicLossScaler s({.initial_scale = 1024, .growth_interval = 3, .hysteresis = 2});
  s.update(true);  // first overflow: within hysteresis, scale kept
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.hysteresis_step(), 1);
  s.update(true);  // second: backs off
  EXPECT_EQ(s.scale(), 512);
  s.update(true);  // the count is not reset by a backoff, so again
  EXPECT_EQ(s.scale(), 256);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 256);
  s.update(true);  // a clean run shorter than the interval does not reset the count
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.growth_step(), 0);
}

TEST(DynamicLossScaler, GrowsAfterIntervalAndResetsHysteresis) {
  DynamicLossScaler s({.initial_scale = 1024, .growth_interval = 3, .hysteresis = 2});
  s.update(true);
  for (int i = 0; i < 2; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 1024);
  s.update(false);  // third clean step in a row
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.hysteresis_step(), 0);
  EXPECT_EQ(s.growth_step(), 0);
  s.update(true);  // hysteresis starts over: no backoff yet
  EXPECT_EQ(s.scale(), 2048);
  s.update(false);
  s.update(false);
  s.update(true);  // the overflow count survives clean steps short of a growth
  EXPECT_EQ(s.scale(), 1024);
}

TEST(DynamicLossScaler, ClampsToMinAndMax) {
  DynamicLossScaler low({.initial_scale = 2, .hysteresis = 1, .min_scale = 1});
  low.update(true);
  low.update(true);
  low.update(true);
  EXPECT_EQ(low.scale(), 1);
  DynamicLossScaler high({.initial_scale = 8, .growth_interval = 1, .max_scale = 16});
  high.update(false);
  high.update(false);
  high.update(false);
  EXPECT_EQ(high.scale(), 16);
}

TEST(DynamicLossScaler, StateRoundtripContinuesTheSequence) {
  DynamicLossScaler a({.initial_scale = 4096, .growth_interval = 4, .hysteresis = 3});
  for (bool overflow : {true, true, false, false}) a.update(overflow);
  DynamicLossScaler b({.initial_scale = 4096, .growth_interval = 4, .hysteresis = 3});
  b.load_state_dict(a.state_dict());
  for (bool overflow : {true, false, false, false, false, true, true, true}) {
    a.update(overflow);
    b.update(overflow);
    ASSERT_EQ(a.scale(), b.scale());
    ASSERT_EQ(a.hysteresis_step(), b.hysteresis_step());
    ASSERT_EQ(a.growth_step(), b.growth_step());
  }
  EXPECT_THROW(b.load_state_dict(R"({"scale": -1, "growth_step": 0, "hysteresis_step": 0})"), CheckpointError);
  EXPECT_THROW(b.load_state_dict(R"({"scale": 2, "growth_step": -1, "hysteresis_step": 0})"), CheckpointError);
  EXPECT_THROW(b.load_state_dict(R"({"scale": 2, "growth_step": 0, "hysteresis_step": -4})"), CheckpointError);
  EXPECT_THROW(b.load_state_dict("{"), CheckpointError);
}

TEST(DynamicLossScaler, InvalidOptionsAreConfigErrors) {
  EXPECT_THROW(DynamicLossScaler({.growth_factor = 1.0}), ConfigError);
  EXPECT_THROW(DynamicLossScaler({.backoff_factor = 1.5}), ConfigError);
  EXPECT_THROW(DynamicLossScaler({.growth_interval = 0}), ConfigError);
  EXPECT_THROW(DynamicLossScaler({.hysteresis = -1}), ConfigError);
  EXPECT_THROW(DynamicLossScaler({.min_scale = 0}), ConfigError);
  EXPECT_THROW(DynamicLossScaler({.initial_scale = 1 << 30}), ConfigError);  // above max_scale
}

TEST(Unscale, ScalesAndFindsInfAndNan) {
  auto a = at::randn({1000});
  auto b = at::randn({7, 3});
  const auto a0 = a.clone(), b0 = b.clone();
  EXPECT_FALSE(unscale_and_check_finite({a, b, at::Tensor()}, 0.125));
  EXPECT_TRUE(at::equal(a, a0 * 0.125));
  EXPECT_TRUE(at::equal(b, b0 * 0.125));
  b[2][1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(unscale_and_check_finite({a, b}, 1.0));
  b[2][1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(unscale_and_check_finite({b}, 1.0));
}

TEST(Unscale, NonContiguousAndLowPrecisionTakeTheAtenPath) {
  auto t = at::randn({8, 6}).t();
  auto h = at::randn({50}).to(at::kHalf);
  const auto t0 = t.clone(), h0 = h.clone();
  EXPECT_FALSE(unscale_and_check_finite({t, h}, 0.5));
  EXPECT_TRUE(at::equal(t, t0 * 0.5));
  EXPECT_TRUE(at::equal(h, h0 * 0.5));
  h[3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(unscale_and_check_finite({t, h}, 1.0));
}

}  // namespace
}  // namespace colossus::amp
