// Differential fuzz against the reference reader (the `safetensors` Python
// package, as transformers uses it): files made from valid ones by the
// mutations that matter for a loader (header length off by a few bytes,
// offsets shifted, gaps, overlaps, trailing or missing bytes, bad dtype
// strings, huge or malformed shapes, JSON oddities) and generated near-valid
// headers. Whatever the reference refuses, we must refuse; where it accepts
// and we refuse, we are stricter on purpose (duplicate keys, a null
// __metadata__), which the test reports but allows.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "tests/checkpoint/test_util.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

namespace colossus::checkpoint {
namespace {

using testing::TempDir;
using Json = nlohmann::ordered_json;

struct Case {
  std::string label;
  std::string bytes;
};

// A header and data region as separate parts, so mutations can edit either
// and re-encode the length.
struct Parts {
  Json header;
  std::string data;
};

std::string encode(const std::string& header_text, const std::string& data) {
  return testing::raw_safetensors(header_text, data);
}

std::string encode(const Parts& parts) { return encode(parts.header.dump(), parts.data); }

std::string with_length_bytes(std::string bytes, uint64_t header_bytes) {
  std::memcpy(bytes.data(), &header_bytes, 8);
  return bytes;
}

Parts base_parts() {
  Parts p;
  p.header = Json::object();
  p.header["__metadata__"] = {{"format", "pt"}};
  p.header["embed"] = {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}};
  p.header["norm"] = {{"dtype", "BF16"}, {"shape", {3}}, {"data_offsets", {24, 30}}};
  p.header["none"] = {{"dtype", "F16"}, {"shape", {0, 2}}, {"data_offsets", {30, 30}}};
  p.header["mask"] = {{"dtype", "BOOL"}, {"shape", {2}}, {"data_offsets", {30, 32}}};
  p.header["step"] = {{"dtype", "I64"}, {"shape", Json::array()}, {"data_offsets", {32, 40}}};
  p.data.assign(40, '\0');
  for (std::size_t i = 0; i < p.data.size(); ++i) p.data[i] = static_cast<char>(i % 7);
  p.data[30] = 1;  // BOOL bytes must be 0 or 1
  p.data[31] = 0;
  return p;
}

std::vector<std::string> tensor_names(const Json& header) {
  std::vector<std::string> names;
  for (const auto& [name, value] : header.items()) {
    if (name != "__metadata__") names.push_back(name);
  }
  return names;
}

std::vector<Case> make_cases(const std::string& saved_file) {
  std::vector<Case> cases;
  auto add = [&](std::string label, std::string bytes) { cases.push_back({std::move(label), std::move(bytes)}); };
  const Parts base = base_parts();
  add("base", encode(base));
  add("saved by us", saved_file);

  // The length field off by a few bytes, over a plain and a space-padded header.
  for (const auto& [label, bytes] : {std::pair{"plain", encode(base)}, std::pair{"padded", encode(base.header.dump() + "   ", base.data)},
                                     std::pair{"saved", saved_file}}) {
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    for (int delta : {-3, -2, -1, 1, 2, 3}) {
      std::string mutated = bytes;
      uint64_t m = n + static_cast<uint64_t>(static_cast<int64_t>(delta));
      std::memcpy(mutated.data(), &m, 8);
      add(fmt::format("{} header length {:+d}", label, delta), mutated);
    }
  }
  // Every offset shifted by k, with k bytes prepended (the data itself fits).
  for (uint64_t k : {1, 2, 8}) {
    Parts p = base;
    for (const auto& name : tensor_names(p.header)) {
      auto& offsets = p.header[name]["data_offsets"];
      offsets = {offsets[0].get<uint64_t>() + k, offsets[1].get<uint64_t>() + k};
    }
    p.data = std::string(k, '\0') + p.data;
    add(fmt::format("offsets shifted by {}", k), encode(p));
  }
  // A gap after one tensor, an overlap, trailing bytes, missing bytes.
  for (const auto& victim : tensor_names(base.header)) {
    for (int64_t k : {-2, -1, 1, 4}) {
      Parts p = base;
      bool after = false;
      for (const auto& name : tensor_names(p.header)) {
        if (name == victim) after = true;
        if (!after) continue;
        auto& offsets = p.header[name]["data_offsets"];
        const auto begin = offsets[0].get<int64_t>(), end = offsets[1].get<int64_t>();
        offsets = {begin + k < 0 ? 0 : begin + k, end + k < 0 ? 0 : end + k};
      }
      if (k > 0) p.data.append(static_cast<std::size_t>(k), '\0');
      add(fmt::format("tensors from '{}' moved by {}", victim, k), encode(p));
    }
  }
  for (std::size_t k : {1, 7, 64}) add(fmt::format("{} trailing bytes", k), encode(base.header.dump(), base.data + std::string(k, 'x')));
  for (std::size_t k : {1, 8, 40}) add(fmt::format("{} bytes missing", k), encode(base.header.dump(), base.data.substr(0, base.data.size() - k)));
  // dtype strings.
  for (const std::string dtype : {"F33", "f32", "", "F8_E8M0", "F32 ", "Q4", "BF16\n", "F4", "U64"}) {
    Parts p = base;
    p.header["embed"]["dtype"] = dtype;
    add(fmt::format("dtype '{}'", dtype), encode(p));
  }
  // Shapes: huge, overflowing, malformed.
  const std::vector<Json> shapes{{uint64_t{1} << 32, uint64_t{1} << 32},
                                 {uint64_t{1} << 63},
                                 {~uint64_t{0}},
                                 {0, ~uint64_t{0}},
                                 {3, uint64_t{1} << 62},
                                 {6},
                                 {2, 3, 1},
                                 {-6},
                                 {6.0},
                                 {"6"},
                                 Json(),
                                 Json(6)};
  for (const auto& shape : shapes) {
    Parts p = base;
    p.header["embed"]["shape"] = shape;
    add(fmt::format("shape {}", shape.dump()), encode(p));
  }
  // data_offsets malformed.
  for (const auto& offsets : std::vector<Json>{{0, 24, 24}, {0}, {24, 0}, {-1, 23}, {0.0, 24}, Json("0,24"), {0, ~uint64_t{0}}}) {
    Parts p = base;
    p.header["embed"]["data_offsets"] = offsets;
    add(fmt::format("offsets {}", offsets.dump()), encode(p));
  }
  // An empty tensor off the tiling, missing fields, extra fields.
  {
    Parts p = base;
    p.header["none"]["data_offsets"] = {4, 4};
    add("empty tensor inside another", encode(p));
    p = base;
    p.header["none"]["data_offsets"] = {40, 40};
    add("empty tensor at the end", encode(p));
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      p = base;
      p.header["embed"].erase(field);
      add(fmt::format("no {}", field), encode(p));
    }
    p = base;
    p.header["embed"]["extra"] = 1;
    add("extra field", encode(p));
  }
  // JSON and metadata oddities.
  const std::string text = base.header.dump();
  add("leading spaces", encode("  " + text, base.data));
  add("trailing NUL", encode(text + std::string(1, '\0'), base.data));
  add("UTF-8 BOM", encode("\xEF\xBB\xBF" + text, base.data));
  add("invalid UTF-8 in a name", encode("{\"\xff\xfe\":" + std::string(R"({"dtype":"F32","shape":[10],"data_offsets":[0,40]}})"), base.data));
  add("empty header", encode("", base.data));
  add("empty object, no data", encode("{}", ""));
  add("empty object with data", encode("{}", base.data));
  add("header is an array", encode("[]", ""));
  add("duplicate key", encode(R"({"a":{"dtype":"F32","shape":[10],"data_offsets":[0,40]},"a":{"dtype":"F32","shape":[10],"data_offsets":[0,40]}})", base.data));
  add("metadata with a number", encode(R"({"__metadata__":{"x":1},"a":{"dtype":"F32","shape":[10],"data_offsets":[0,40]}})", base.data));
  add("metadata null", encode(R"({"__metadata__":null,"a":{"dtype":"F32","shape":[10],"data_offsets":[0,40]}})", base.data));
  add("entry is a number", encode(R"({"a":5})", ""));
  add("length beyond the file", with_length_bytes(encode(base), 1'000'000));
  add("length 2^63", with_length_bytes(encode(base), uint64_t{1} << 63));
  add("file of 7 bytes", std::string(7, '\0'));

  // Random: byte flips and digit changes in the header, and generated headers.
  std::mt19937_64 rng(2021);
  auto uniform = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const std::string base_bytes = encode(base);
  const uint64_t header_end = 8 + text.size();
  for (int i = 0; i < 200; ++i) {
    std::string bytes = base_bytes;
    for (int m = 0, n = 1 + static_cast<int>(uniform(2)); m < n; ++m) {
      const uint64_t at = 8 + uniform(header_end - 8);
      if (std::isdigit(static_cast<unsigned char>(bytes[at])) && uniform(2) == 0) {
        bytes[at] = static_cast<char>('0' + uniform(10));
      } else {
        bytes[at] = "{}[]\",: 0123456789-.eE"[uniform(22)];
      }
    }
    add(fmt::format("random header edit {}", i), bytes);
  }
  const std::vector<std::string> dtypes{"F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "C64"};
  const std::vector<int64_t> itemsizes{4, 2, 2, 8, 8, 4, 1, 1, 1, 8};
  for (int i = 0; i < 200; ++i) {
    Parts p;
    p.header = Json::object();
    uint64_t offset = 0;
    for (int e = 0, n = static_cast<int>(uniform(4)); e < n; ++e) {
      const auto d = uniform(dtypes.size());
      Json shape = Json::array();
      uint64_t numel = 1;
      for (uint64_t r = uniform(3); r > 0; --r) {
        const uint64_t dim = uniform(4);
        numel *= dim;
        shape.push_back(dim);
      }
      uint64_t begin = offset, end = offset + numel * static_cast<uint64_t>(itemsizes[d]);
      switch (uniform(8)) {  // mostly valid; sometimes one thing off
        case 0: begin += uniform(3); break;
        case 1: end += uniform(3); break;
        case 2: begin = begin >= 1 ? begin - 1 : 0; break;
        default: break;
      }
      offset = std::max(end, begin);
      p.header[fmt::format("t{}", uniform(5))] = {{"dtype", dtypes[d]}, {"shape", shape}, {"data_offsets", {begin, end}}};
    }
    const uint64_t data_bytes = uniform(6) == 0 ? offset + uniform(5) - std::min<uint64_t>(offset, 2) : offset;
    p.data.assign(data_bytes, '\0');
    std::string header = p.header.dump();
    header.append(uniform(4), ' ');
    add(fmt::format("generated {}", i), encode(header, p.data));
  }
  return cases;
}

TEST(DifferentialFuzz, WhatTheReferenceRefusesWeRefuse) {
  if (!testing::python_available()) GTEST_SKIP() << "no Python oracle at " COLOSSUS_PYTHON;
  TempDir dir(/*in_memory=*/true);
  const std::string saved = dir.file("saved.safetensors");
  save_safetensors(saved, {{"w", at::arange(6, at::kFloat).reshape({2, 3})}, {"b", at::ones({3}, at::kBFloat16)}},
                   {{"format", "pt"}});
  const auto cases = make_cases(testing::read_bytes(saved));
  for (std::size_t i = 0; i < cases.size(); ++i) testing::write_bytes(dir.file(fmt::format("case-{}.safetensors", i)), cases[i].bytes);

  // The reference: safe_open + get_tensor of every key, as transformers loads.
  std::string output;
  const int status = testing::run_python(
      fmt::format(R"(
import json
from safetensors import safe_open
verdicts = []
for i in range({1}):
    try:
        with safe_open("{0}/case-%d.safetensors" % i, "pt") as f:
            for k in f.keys():
                f.get_tensor(k)
        verdicts.append(1)
    except Exception:
        verdicts.append(0)
print("VERDICTS " + json.dumps(verdicts))
)",
                  dir.path(), cases.size()),
      output);
  ASSERT_EQ(status, 0) << output;
  const auto json_at = output.find("VERDICTS ");
  ASSERT_NE(json_at, std::string::npos) << output;
  const auto verdicts = nlohmann::json::parse(output.substr(json_at + 9)).get<std::vector<int>>();
  ASSERT_EQ(verdicts.size(), cases.size());

  int both_accept = 0, both_refuse = 0, only_we_refuse = 0;
  std::vector<std::string> looser;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file(fmt::format("case-{}.safetensors", i));
    bool ours = true;
    try {
      auto file = SafetensorsFile::open(path);
      for (const auto& name : file.keys()) file.get(name);
    } catch (const CheckpointError&) {
      ours = false;
    } catch (const std::exception& e) {
      ADD_FAILURE() << cases[i].label << ": a non-CheckpointError: " << e.what();
      ours = false;
    }
    const bool reference = verdicts[i] == 1;
    if (ours && reference) ++both_accept;
    if (!ours && !reference) ++both_refuse;
    if (!ours && reference) ++only_we_refuse;
    if (ours && !reference) looser.push_back(cases[i].label);
  }
  EXPECT_TRUE(looser.empty()) << "we accept " << looser.size() << " file(s) the reference refuses: "
                              << fmt::format("{}", fmt::join(looser, "; "));
  EXPECT_EQ(verdicts[0], 1) << "the reference must accept the base file";
  EXPECT_EQ(verdicts[1], 1);
  // Both outcomes must be exercised, or the comparison says little.
  EXPECT_GT(both_accept, 50);
  EXPECT_GT(both_refuse, 100);
  // Stricter on purpose (duplicates, null metadata); should stay rare.
  EXPECT_LT(only_we_refuse, 10) << "refused where the reference accepts: " << only_we_refuse;
}

}  // namespace
}  // namespace colossus::checkpoint
