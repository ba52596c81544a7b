// Randomised headers: thousands of mutations of a valid file and of generated
// near-valid headers. Each must either throw CheckpointError or open, and an
// opened file must satisfy, by an independent check, every invariant the
// reader promises: offsets inside the data region, sizes matching shapes, the
// data region tiled exactly (no gap, no overlap, nothing after the last
// tensor), and get() returning exactly the bytes at those offsets.
#include "colossus/checkpoint/dtypes.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "tests/checkpoint/test_util.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

namespace colossus::checkpoint {
namespace {

using testing::TempDir;

struct Outcome {
  int opened = 0;
  int rejected = 0;
};

// Opens `bytes` as a file; on success checks the invariants against the raw
// bytes. Returns "" when all is well, else what went wrong.
std::string probe(const std::string& path, const std::string& bytes, Outcome& outcome) {
  testing::write_bytes(path, bytes);
  std::optional<SafetensorsFile> file;
  try {
    file = SafetensorsFile::open(path);
  } catch (const CheckpointError& e) {
    if (std::string(e.what()).find(path) == std::string::npos) return "error does not name the file";
    ++outcome.rejected;
    return "";
  } catch (const std::exception& e) {
    return fmt::format("open threw a non-CheckpointError: {}", e.what());
  }
  ++outcome.opened;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  if (header_bytes > bytes.size() - 8) return "accepted a header length past the end";
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = bytes.size() - data_start;
  auto header = nlohmann::json::parse(bytes.substr(8, header_bytes), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return "accepted a header that is not a JSON object";
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& name : file->keys()) {
    const auto& entry = header.at(name);
    auto begin = entry.at("data_offsets").at(0).get<uint64_t>();
    auto end = entry.at("data_offsets").at(1).get<uint64_t>();
    if (begin > end || end > data_bytes) return fmt::format("accepted offsets [{}, {}] of '{}'", begin, end, name);
    at::Tensor t;
    try {
      t = file->get(name);
    } catch (const std::exception& e) {
      return fmt::format("get('{}') of an accepted file threw: {}", name, e.what());
    }
    auto info = dtype_from_name(entry.at("dtype").get<std::string>());
    if (!info || t.scalar_type() != info->scalar_type) return fmt::format("'{}' has the wrong dtype", name);
    if (static_cast<uint64_t>(t.nbytes()) != end - begin) return fmt::format("'{}' size mismatch", name);
    if (t.nbytes() > 0 && std::memcmp(t.const_data_ptr(), bytes.data() + data_start + begin, t.nbytes()) != 0) {
      return fmt::format("'{}' does not hold the bytes at its offsets", name);
    }
    ranges.emplace_back(begin, end);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin < covered) return "accepted overlapping tensors";
    if (begin > covered) return "accepted a gap between tensors";
    covered = end;
  }
  if (covered != data_bytes) return "accepted a data region the tensors do not cover exactly";
  return "";
}

std::string valid_file_bytes(const TempDir& dir) {
  std::string path = dir.file("base.safetensors");
  save_safetensors(path,
                   {{"embed", at::arange(24, at::kFloat).reshape({4, 6})},
                    {"norm", at::ones({6}, at::kBFloat16)},
                    {"mask", at::tensor({1, 0, 1}).to(at::kBool)},
                    {"step", at::scalar_tensor(7, at::kLong)},
                    {"none", at::zeros({0, 2}, at::kHalf)}},
                   {{"format", "pt"}});
  return testing::read_bytes(path);
}

TEST(HeaderFuzz, RandomMutationsOfAValidFile) {
  TempDir dir(/*in_memory=*/true);
  const std::string base = valid_file_bytes(dir);
  uint64_t base_header = 0;
  std::memcpy(&base_header, base.data(), 8);
  std::mt19937_64 rng(20240601);
  auto uniform = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const std::string json_chars = "{}[]\",:0123456789-+.eE tfnul\\ ";
  const std::vector<std::string> tokens = {
      "\"F32\"", "\"BF16\"", "\"BOOL\"", "\"X\"", "18446744073709551615", "-1",   "1e30",
      "0",       "[]",       "{}",       "null",  "\"__metadata__\"",     "[0,0]"};
  Outcome outcome;
  std::string path = dir.file("mutant.safetensors");
  for (int iteration = 0; iteration < 4000; ++iteration) {
    std::string bytes = base;
    int mutations = 1 + static_cast<int>(uniform(3));
    for (int m = 0; m < mutations && bytes.size() > 8; ++m) {
      uint64_t header_end = std::min<uint64_t>(bytes.size(), 8 + base_header);
      switch (uniform(7)) {
        case 0:  // flip bits anywhere in the length or header
          bytes[uniform(header_end)] ^= static_cast<char>(1 + uniform(255));
          break;
        case 1:  // a JSON-significant character inside the header
          bytes[8 + uniform(header_end - 8)] = json_chars[uniform(json_chars.size())];
          break;
        case 2: {  // a token pasted over part of the header
          const auto& token = tokens[uniform(tokens.size())];
          uint64_t at = 8 + uniform(header_end - 8);
          bytes.replace(at, std::min<uint64_t>(token.size(), bytes.size() - at), token);
          break;
        }
        case 3: {  // the length field: tiny, huge, or just off
          uint64_t options[] = {uniform(16), base_header + uniform(64) - 32, ~uint64_t{0} - uniform(16),
                                uint64_t{1} << uniform(64), bytes.size() - 8 - uniform(8)};
          uint64_t n = options[uniform(5)];
          std::memcpy(bytes.data(), &n, 8);
          break;
        }
        case 4:  // truncate
          bytes.resize(uniform(bytes.size() + 1));
          break;
        case 5:  // delete a header byte (the length no longer matches)
          bytes.erase(8 + uniform(header_end - 8), 1);
          break;
        default: {  // a digit changed inside a number, length kept
          std::vector<uint64_t> digits;
          for (uint64_t i = 8; i < header_end; ++i) {
            if (std::isdigit(static_cast<unsigned char>(bytes[i]))) digits.push_back(i);
          }
          if (!digits.empty()) bytes[digits[uniform(digits.size())]] = static_cast<char>('0' + uniform(10));
          break;
        }
      }
    }
    std::string problem = probe(path, bytes, outcome);
    ASSERT_EQ(problem, "") << "iteration " << iteration;
  }
  // Both outcomes must actually be exercised, or the fuzzer tests nothing.
  EXPECT_GT(outcome.rejected, 1000);
  EXPECT_GT(outcome.opened, 30);
}

// Headers generated from the format's grammar with wrong values mixed in:
// the reader's validation is what decides, so both outcomes occur often.
TEST(HeaderFuzz, GeneratedNearValidHeaders) {
  TempDir dir(/*in_memory=*/true);
  std::mt19937_64 rng(7);
  auto uniform = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const std::vector<std::string> dtypes = {"F32",  "F16",     "BF16", "F64", "I64", "U8",
                                           "BOOL", "F8_E4M3", "C64",  "f32", ""};
  auto number = [&]() -> nlohmann::json {
    switch (uniform(8)) {
      case 0:
        return -static_cast<int64_t>(uniform(5)) - 1;
      case 1:
        return 1.5;
      case 2:
        return ~uint64_t{0} - uniform(4);
      case 3:
        return uint64_t{1} << uniform(64);
      case 4:
        return "8";
      default:
        return uniform(40);
    }
  };
  Outcome outcome;
  std::string path = dir.file("generated.safetensors");
  for (int iteration = 0; iteration < 3000; ++iteration) {
    uint64_t data_bytes = uniform(96);
    nlohmann::json header = nlohmann::json::object();
    uint64_t offset = 0;
    int entries = static_cast<int>(uniform(5));
    for (int e = 0; e < entries; ++e) {
      nlohmann::json entry = nlohmann::json::object();
      std::string dtype = dtypes[uniform(dtypes.size())];
      auto info = dtype_from_name(dtype);
      nlohmann::json shape = nlohmann::json::array();
      uint64_t numel = 1;
      for (uint64_t d = uniform(4); d > 0; --d) {
        uint64_t dim = uniform(5);
        numel *= dim;
        shape.push_back(dim);
      }
      uint64_t bytes = numel * (info ? info->itemsize : 1);
      uint64_t begin = uniform(4) == 0 ? uniform(64) : offset;  // mostly consecutive, sometimes anywhere
      int64_t skew = uniform(6) == 0 ? static_cast<int64_t>(uniform(5)) - 2 : 0;  // a few bytes short or long
      uint64_t end =
          begin + bytes < 2 ? begin + bytes : static_cast<uint64_t>(static_cast<int64_t>(begin + bytes) + skew);
      offset = end;
      if (uniform(20) != 0) entry["dtype"] = dtype;
      if (uniform(20) != 0) entry["shape"] = uniform(15) == 0 ? nlohmann::json::array({number()}) : shape;
      if (uniform(20) != 0) {
        entry["data_offsets"] =
            uniform(15) == 0 ? nlohmann::json::array({number(), number()}) : nlohmann::json::array({begin, end});
      }
      header[fmt::format("t{}", uniform(6))] = uniform(30) == 0 ? nlohmann::json(number()) : entry;
    }
    if (uniform(4) == 0) header["__metadata__"] = {{"format", uniform(5) == 0 ? number() : nlohmann::json("pt")}};
    // Mostly exactly what the tensors cover, as a valid file must be.
    if (uniform(3) != 0) data_bytes = std::min<uint64_t>(offset, 4096);
    std::string text = header.dump();
    text.append(uniform(9), ' ');
    std::string problem = probe(path, testing::raw_safetensors(text, std::string(data_bytes, '\x5a')), outcome);
    ASSERT_EQ(problem, "") << "iteration " << iteration << ": " << text;
  }
  EXPECT_GT(outcome.rejected, 500);
  EXPECT_GT(outcome.opened, 500);
}

TEST(HeaderFuzz, GarbageAndPathologicalHeaders) {
  TempDir dir(/*in_memory=*/true);
  std::mt19937_64 rng(99);
  Outcome outcome;
  std::string path = dir.file("garbage.safetensors");
  for (int iteration = 0; iteration < 1000; ++iteration) {
    std::string header(std::uniform_int_distribution<int>(0, 200)(rng), '\0');
    for (auto& c : header) c = static_cast<char>(rng());
    if (iteration % 2 == 0 && !header.empty()) header[0] = '{';
    ASSERT_EQ(probe(path, testing::raw_safetensors(header, "data"), outcome), "") << "iteration " << iteration;
  }
  // Deep nesting must neither overflow the stack nor be accepted.
  const int depth = 200000;
  std::string nested = std::string(depth, '[') + std::string(depth, ']');
  ASSERT_EQ(probe(path, testing::raw_safetensors(nested, ""), outcome), "");
  nested = "{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
  ASSERT_EQ(probe(path, testing::raw_safetensors(nested, ""), outcome), "");
  EXPECT_EQ(outcome.opened, 0);
}

}  // namespace
}  // namespace colossus::checkpoint
