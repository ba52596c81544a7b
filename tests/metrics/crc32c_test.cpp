// CRC32C against the standard check value and the TFRecord frame layout.
#include "colossus/metrics/crc32c.h"
#include "colossus/metrics/tfrecord.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace colossus::metrics {

TEST(Crc32c, CheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI) test vector: 32 bytes of zeros.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
}

TEST(Crc32c, Continues) {
  std::string text = "The quick brown fox jumps over the lazy dog";
  uint32_t whole = crc32c(text);
  uint32_t first = crc32c(text.data(), 10);
  EXPECT_EQ(crc32c(text.data() + 10, text.size() - 10, first), whole);
}

TEST(Crc32c, Mask) {
  // The mask is a rotation plus a constant; unmasking recovers the CRC.
  uint32_t crc = crc32c("123456789");
  uint32_t masked = mask_crc32c(crc);
  uint32_t rotated = masked - 0xa282ead8u;
  EXPECT_EQ((rotated >> 17) | (rotated << 15), crc);
}

TEST(TfRecord, Frame) {
  std::string data = "hello";
  std::string frame = frame_tfrecord(data);
  ASSERT_EQ(frame.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  std::memcpy(&length, frame.data(), 8);  // little-endian host (x86-64, aarch64)
  EXPECT_EQ(length, data.size());
  uint32_t length_crc = 0;
  std::memcpy(&length_crc, frame.data() + 8, 4);
  EXPECT_EQ(length_crc, mask_crc32c(crc32c(frame.data(), 8)));
  EXPECT_EQ(frame.substr(12, data.size()), data);
  uint32_t data_crc = 0;
  std::memcpy(&data_crc, frame.data() + 12 + data.size(), 4);
  EXPECT_EQ(data_crc, mask_crc32c(crc32c(data)));
}

}  // namespace colossus::metrics
