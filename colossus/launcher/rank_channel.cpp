#include "colossus/launcher/rank_channel.h"

#include "colossus/core/errors.h"
#include "colossus/launcher/fd.h"

#include <fmt/format.h>

#include <fstream>

namespace colossus::launcher {

std::string encode_frame(FrameType type, std::string_view payload) {
  std::string frame;
  frame.reserve(5 + payload.size());
  frame.push_back(static_cast<char>(type));
  auto length = static_cast<uint32_t>(payload.size());
  for (int shift = 24; shift >= 0; shift -= 8) frame.push_back(static_cast<char>((length >> shift) & 0xff));
  frame.append(payload);
  return frame;
}

bool send_frame(int fd, FrameType type, std::string_view payload) {
  while (payload.size() > kMaxFramePayload) {
    if (!write_all(fd, encode_frame(type, payload.substr(0, kMaxFramePayload)))) return false;
    payload.remove_prefix(kMaxFramePayload);
  }
  return write_all(fd, encode_frame(type, payload));
}

std::optional<Frame> FrameReader::next() {
  if (buffer_.size() < 5) return std::nullopt;
  char type = buffer_[0];
  uint32_t length = 0;
  for (int i = 1; i <= 4; ++i) length = (length << 8) | static_cast<unsigned char>(buffer_[i]);
  bool known = type == 'H' || type == 'O' || type == 'E' || type == 'S' || type == 'Q';
  if (!known || length > kMaxFramePayload) {
    throw LaunchError(fmt::format("rank channel got a malformed frame (type byte {}, length {})",
                                  static_cast<int>(static_cast<unsigned char>(type)), length));
  }
  if (buffer_.size() < 5 + length) return std::nullopt;
  Frame frame{static_cast<FrameType>(type), buffer_.substr(5, length)};
  buffer_.erase(0, 5 + length);
  return frame;
}

std::string random_token() {
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  random.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
  if (!random) throw LaunchError("cannot read /dev/urandom for the rank channel token");
  std::string token;
  for (unsigned char byte : bytes) token += fmt::format("{:02x}", byte);
  return token;
}

}  // namespace colossus::launcher
