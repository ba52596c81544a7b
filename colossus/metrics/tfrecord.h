// TFRecord framing, the container of TensorBoard event files: per record a
// uint64 length, its masked CRC32C, the bytes, and their masked CRC32C.
#pragma once
#include <string>
#include <string_view>

namespace colossus::metrics {

// One framed record (little-endian fields): 8 + 4 + data.size() + 4 bytes.
std::string frame_tfrecord(std::string_view data);

}  // namespace colossus::metrics
