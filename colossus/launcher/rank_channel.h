// The link between `colossus run --backend mpi` and each `colossus _rank`
// wrapper that mpirun starts. mpirun's own output forwarding can split a line
// between two reads and mix ranks mid-line, so instead every wrapper opens a
// TCP connection to the launcher and sends its program's stdout, stderr and
// exit status as frames; the launcher prefixes lines exactly as in env mode
// and can ask a wrapper to stop its program. Frame: type (1 byte), payload
// length (4 bytes, big-endian), payload.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace colossus::launcher {

enum class FrameType : char {
  Hello = 'H',   // wrapper -> launcher: "<token> <rank>"
  Stdout = 'O',  // wrapper -> launcher: bytes the program wrote
  Stderr = 'E',
  Status = 'S',  // wrapper -> launcher: ExitStatus::encode()
  Stop = 'Q',    // launcher -> wrapper: signal number to stop the program with
};

struct Frame {
  FrameType type;
  std::string payload;
};

inline constexpr size_t kMaxFramePayload = 1 << 20;
// Where the wrapper finds the launcher ("host:port") and the token it proves
// itself with (so a stray connection to the port is not taken for a rank).
inline constexpr const char* kChannelAddressVar = "COLOSSUS_RANK_CHANNEL";
inline constexpr const char* kChannelTokenVar = "COLOSSUS_RANK_TOKEN";

std::string encode_frame(FrameType type, std::string_view payload);
// Writes one frame; false when the other side is gone.
bool send_frame(int fd, FrameType type, std::string_view payload);

// Reassembles frames from a byte stream.
class FrameReader {
 public:
  void feed(std::string_view bytes) { buffer_.append(bytes); }
  // The next complete frame; throws LaunchError on an unknown type or a
  // payload larger than kMaxFramePayload.
  std::optional<Frame> next();

 private:
  std::string buffer_;
};

// 32 hex digits from /dev/urandom.
std::string random_token();

}  // namespace colossus::launcher
