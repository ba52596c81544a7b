// Compact number formatting used by the progress bar and plot labels.
#include "colossus/metrics/format.h"

#include <gtest/gtest.h>

#include <cmath>

namespace colossus::metrics {

TEST(Format, Count) {
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(950), "950");
  EXPECT_EQ(format_count(12.5), "12.5");
  EXPECT_EQ(format_count(12345), "12.3k");
  EXPECT_EQ(format_count(1.234e6), "1.23M");
  EXPECT_EQ(format_count(999960), "1.00M");
  EXPECT_EQ(format_count(3.5e9), "3.50G");
  EXPECT_EQ(format_count(-2000), "-2.00k");
}

TEST(Format, Bytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(int64_t{2254857830}), "2.1 GiB");
  EXPECT_EQ(format_bytes(int64_t{150} << 30), "150 GiB");
  EXPECT_EQ(format_bytes(int64_t{1} << 40), "1.0 TiB");
}

TEST(Format, Duration) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(45.4), "45s");
  EXPECT_EQ(format_duration(192), "3m12s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(2 * 86400 + 3 * 3600 + 59), "2d03h");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(NAN), "?");
}

TEST(Format, Scalar) {
  EXPECT_EQ(format_scalar(2.31), "2.310");
  EXPECT_EQ(format_scalar(3e-4), "3.0e-04");
  EXPECT_EQ(format_scalar(10.9), "10.90");
  EXPECT_EQ(format_scalar(0), "0");
  EXPECT_EQ(format_scalar(123456), "1.2e+05");
  EXPECT_EQ(format_scalar(INFINITY), "inf");
}

}  // namespace colossus::metrics
