#include "colossus/metrics/tfrecord.h"

#include "colossus/metrics/crc32c.h"

#include <cstdint>

namespace colossus::metrics {

namespace {

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

}  // namespace

std::string frame_tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le(out, data.size(), 8);
  append_le(out, mask_crc32c(crc32c(out.data(), 8)), 4);
  out.append(data);
  append_le(out, mask_crc32c(crc32c(data)), 4);
  return out;
}

}  // namespace colossus::metrics
