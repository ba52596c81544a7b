#include "colossus/data/token_shards.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

namespace colossus::data {

namespace {

constexpr char kMagic[8] = {'C', 'L', 'S', 'T', 'O', 'K', 'S', '1'};
constexpr size_t kHeaderBytes = 32;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t bytes_per_token;
  uint64_t num_tokens;
  uint64_t vocab_size;
};
static_assert(sizeof(Header) == kHeaderBytes);

}  // namespace

struct TokenShard::Mapping {
  ~Mapping() {
    if (data != nullptr && data != MAP_FAILED) munmap(data, length);
  }
  void* data = nullptr;
  size_t length = 0;
};

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 31)) {
    throw ConfigError(fmt::format("token shard {}: vocab_size {} must be in 1..2^31", path, vocab_size));
  }
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = 1;
  header.bytes_per_token = vocab_size <= 65536 ? 2 : 4;
  header.num_tokens = tokens.size();
  header.vocab_size = static_cast<uint64_t>(vocab_size);
  std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw ConfigError(fmt::format("cannot write token shard {}", tmp));
    out.write(reinterpret_cast<const char*>(&header), sizeof(header));
    if (header.bytes_per_token == 2) {
      std::vector<uint16_t> narrow(tokens.size());
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] >= vocab_size) {
          throw ConfigError(fmt::format("token shard {}: token {} at {} is outside the vocabulary 0..{}", path,
                                        tokens[i], i, vocab_size - 1));
        }
        narrow[i] = static_cast<uint16_t>(tokens[i]);
      }
      out.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    } else {
      out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    }
    out.flush();
    if (!out) throw ConfigError(fmt::format("writing token shard {} failed (disk full?)", tmp));
  }
  std::filesystem::rename(tmp, path);
}

TokenShard TokenShard::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw ConfigError(fmt::format("token shard {} cannot be opened: {}", path, std::strerror(errno)));
  struct stat st{};
  fstat(fd, &st);
  auto length = static_cast<size_t>(st.st_size);
  if (length < kHeaderBytes) {
    ::close(fd);
    throw ConfigError(fmt::format("token shard {} is {} bytes, shorter than its 32-byte header", path, length));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->length = length;
  mapping->data = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mapping->data == MAP_FAILED) throw ConfigError(fmt::format("token shard {} cannot be mapped", path));
  Header header{};
  std::memcpy(&header, mapping->data, sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) {
    throw ConfigError(fmt::format("{} is not a Colossus token shard (bad magic); make shards with `colossus tokenize`", path));
  }
  if (header.version != 1 || (header.bytes_per_token != 2 && header.bytes_per_token != 4)) {
    throw ConfigError(fmt::format("token shard {} has version {} / {} bytes per token; this build reads version 1 "
                                  "with 2 or 4", path, header.version, header.bytes_per_token));
  }
  uint64_t expected = kHeaderBytes + header.num_tokens * header.bytes_per_token;
  if (expected != length) {
    throw ConfigError(fmt::format("token shard {} is truncated or padded: header says {} tokens ({} bytes), file "
                                  "has {} bytes", path, header.num_tokens, expected, length));
  }
  TokenShard shard;
  shard.mapping_ = std::move(mapping);
  shard.path_ = path;
  shard.num_tokens_ = static_cast<int64_t>(header.num_tokens);
  shard.vocab_size_ = static_cast<int64_t>(header.vocab_size);
  shard.bytes_per_token_ = static_cast<int>(header.bytes_per_token);
  return shard;
}

void TokenShard::read(int64_t begin, int64_t count, int64_t* out) const {
  if (begin < 0 || count < 0 || begin + count > num_tokens_) {
    throw ConfigError(fmt::format("token shard {}: range [{}, {}) outside its {} tokens", path_, begin, begin + count,
                                  num_tokens_));
  }
  const auto* body = static_cast<const char*>(mapping_->data) + kHeaderBytes;
  if (bytes_per_token_ == 2) {
    const auto* ids = reinterpret_cast<const uint16_t*>(body) + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = ids[i];
  } else {
    const auto* ids = reinterpret_cast<const uint32_t*>(body) + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = ids[i];
  }
}

std::vector<std::string> list_token_shards(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw ConfigError(fmt::format("token shard directory {} does not exist", dir));
  }
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".tokens") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) throw ConfigError(fmt::format("no *.tokens shards in {}", dir));
  return paths;
}

}  // namespace colossus::data
