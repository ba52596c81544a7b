// SafetensorsFile and save_safetensors: round trips of every dtype and odd
// shape, zero-copy views and their lifetime, the byte layout, and one test per
// kind of malformed file, each checking what the error message names.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/metrics/memory.h"
#include "tests/checkpoint/test_util.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

namespace colossus::checkpoint {
namespace {

using testing::TempDir;
using testing::throws_checkpoint_error;

TEST(SafetensorsRoundTrip, EveryDtypeAndShape) {
  TempDir dir;
  NamedTensors tensors;
  int64_t seed = 0;
  for (const auto& [name, dtype] : testing::all_dtypes()) {
    tensors.emplace_back(name + ".matrix", testing::sample_tensor(dtype, {3, 5}, seed++));
    tensors.emplace_back(name + ".scalar", testing::sample_tensor(dtype, {}, seed++));
    tensors.emplace_back(name + ".empty", testing::sample_tensor(dtype, {0, 4}, seed++));
    tensors.emplace_back(name + ".empty_middle", testing::sample_tensor(dtype, {2, 0, 3}, seed++));
    tensors.emplace_back(name + ".rank4", testing::sample_tensor(dtype, {2, 1, 3, 2}, seed++));
  }
  std::map<std::string, std::string> metadata{{"format", "pt"}, {"step", "1200"}};
  std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, metadata);

  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), metadata);
  EXPECT_EQ(file.keys().size(), tensors.size());
  for (const auto& [name, want] : tensors) {
    ASSERT_TRUE(file.contains(name)) << name;
    EXPECT_EQ(file.dtype(name), want.scalar_type()) << name;
    EXPECT_EQ(file.shape(name), want.sizes().vec()) << name;
    EXPECT_TRUE(testing::same_tensor(file.get(name), want)) << name;
  }
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(path), tensors));
}

TEST(SafetensorsRoundTrip, NonContiguousInputsAreSavedAsTheirValues) {
  TempDir dir;
  at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  NamedTensors tensors{
      {"transposed", base.t()},
      {"strided_slice", base.slice(1, 0, 6, 2)},
      {"offset_view", base[2]},
      {"expanded", at::arange(3, at::kInt).unsqueeze(0).expand({4, 3})},
      {"bf16_column", base.to(at::kBFloat16).select(1, 3)},
      {"conjugated", at::complex(base, -base).conj()},
      {"bool_transposed", base.gt(10).t()},
  };
  std::string path = dir.file("views.safetensors");
  save_safetensors(path, tensors);
  auto loaded = load_state_dict(path);
  for (const auto& [name, want] : tensors) {
    EXPECT_TRUE(testing::same_tensor(loaded.at(name), want.contiguous())) << name;
    EXPECT_TRUE(loaded.at(name).is_contiguous()) << name;
  }
  // The lazy conjugate bit must be resolved, not dropped.
  EXPECT_TRUE(at::equal(loaded.at("conjugated"), at::complex(base, base)));
}

TEST(SafetensorsLayout, HeaderIsPaddedAndEveryTensorAligned) {
  TempDir dir;
  std::string path = dir.file("layout.safetensors");
  NamedTensors tensors{{"b", at::ones({3}, at::kByte)},
                       {"a", at::ones({5}, at::kDouble)},
                       {"h", at::ones({7}, at::kHalf)},
                       {"f", at::ones({1}, at::kFloat)}};
  save_safetensors(path, tensors, {{"k", "v"}});
  std::string bytes = testing::read_bytes(path);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  std::string header = bytes.substr(8, header_bytes);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1) << "padding must be spaces after the JSON";
  // Larger dtypes first, as the safetensors package lays them out.
  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.keys(), (std::vector<std::string>{"a", "f", "h", "b"}));
  EXPECT_EQ(bytes.size(), 8 + header_bytes + 5 * 8 + 4 + 7 * 2 + 3);
  for (const auto& name : file.keys()) {
    auto t = file.get(name);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % t.element_size(), 0u) << name;
  }
}

TEST(SafetensorsViews, ZeroCopyPrivateAndOutliveTheFileObject) {
  TempDir dir;
  std::string path = dir.file("w.safetensors");
  save_safetensors(path, {{"w", at::arange(1000, at::kFloat)}});
  at::Tensor kept;
  {
    auto file = SafetensorsFile::open(path);
    at::Tensor first = file.get("w");
    at::Tensor second = file.get("w");
    EXPECT_EQ(first.data_ptr(), second.data_ptr()) << "get() must view the mapping, not copy";
    first.add_(1);  // lands in private pages: visible to this mapping only
    EXPECT_EQ(second[0].item<float>(), 1.0f);
    kept = file.get("w");
  }  // the SafetensorsFile is gone; `kept` still holds the mapping
  EXPECT_EQ(kept[999].item<float>(), 1000.0f);
  auto reopened = SafetensorsFile::open(path);
  EXPECT_TRUE(at::equal(reopened.get("w"), at::arange(1000, at::kFloat))) << "the file must be unchanged";
}

TEST(SafetensorsViews, ADeadViewLeavesTheResidentSet) {
  TempDir dir;
  std::string path = dir.file("big.safetensors");
  constexpr int64_t kBytes = int64_t{64} << 20;
  save_safetensors(path, {{"w", at::ones({kBytes / 4}, at::kFloat)}});
  auto file = SafetensorsFile::open(path);
  const int64_t before = metrics::host_rss_bytes();
  int64_t touched = 0;
  {
    at::Tensor w = file.get("w");
    EXPECT_EQ(w.sum().item<double>(), static_cast<double>(kBytes / 4));  // faults every page in
    touched = metrics::host_rss_bytes();
    w.add_(1);  // private pages: lost with the view
  }
  const int64_t after = metrics::host_rss_bytes();
  EXPECT_GT(touched - before, kBytes / 2) << "reading the view must map its pages";
  EXPECT_LT(after - before, kBytes / 8) << "the dead view's pages must leave the RSS";
  // Pages wholly inside the tensor were dropped (the partial ones at its ends
  // may be shared with a neighbour and stay): a new view reads the file there.
  EXPECT_EQ(file.get("w")[kBytes / 8].item<float>(), 1.0f) << "a new view reads the file again";
}

TEST(SafetensorsViews, UnalignedDataIsCopiedAligned) {
  TempDir dir;
  // A 61-byte header (not padded) puts the data at file offset 69: misaligned
  // for every dtype wider than a byte.
  std::string header = R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
  header.append(61 - header.size(), ' ');
  double values[2] = {1.5, -2.25};
  std::string path = dir.file("unaligned.safetensors");
  testing::write_bytes(path, testing::raw_safetensors(header, std::string(reinterpret_cast<char*>(values), 16)));
  auto t = SafetensorsFile::open(path).get("x");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 8, 0u);
  EXPECT_EQ(t[0].item<double>(), 1.5);
  EXPECT_EQ(t[1].item<double>(), -2.25);
}

// As the reference reader: tensors must tile the data region (a gap is
// refused), empty tensors may share the offset where the tiling is, and
// entry fields other than dtype, shape and data_offsets are ignored.
TEST(SafetensorsReader, RefusesGapsAcceptsSharedEmptyOffsetsAndUnknownEntryFields) {
  TempDir dir;
  std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"note":"x"},)"
                       R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                       R"("e2":{"dtype":"F32","shape":[0,3],"data_offsets":[2,2]}})";
  std::string path = dir.file("tiled.safetensors");
  testing::write_bytes(path, testing::raw_safetensors(header, std::string("\x07\x09", 2)));
  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.get("a")[1].item<uint8_t>(), 9);
  EXPECT_EQ(file.shape("e2"), (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(file.metadata().empty());
  std::string gaps = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                     R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  path = dir.file("gaps.safetensors");
  testing::write_bytes(path, testing::raw_safetensors(gaps, std::string("\x00\x00\x00\x00\x07\x09\x00", 7)));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(path); }, {path, "gap"}));
}

TEST(SafetensorsWriter, RefusesBadTensorsAndLeavesNoTempFile) {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  at::Tensor t = at::ones({2});
  EXPECT_TRUE(throws_checkpoint_error(
      [&] {
        save_safetensors(path, {{"w", t}, {"v", t}, {"w", t}});
      },
      {path, "'w'", "twice"}));
  EXPECT_TRUE(throws_checkpoint_error([&] { save_safetensors(path, {{"__metadata__", t}}); }, {"reserved"}));
  EXPECT_TRUE(throws_checkpoint_error(
      [&] {
        save_safetensors(path, {{"c", at::ones({2}, at::kComplexDouble)}});
      },
      {"'c'", "ComplexDouble", "no safetensors equivalent"}));
  EXPECT_TRUE(throws_checkpoint_error([&] { save_safetensors(path, {{"u", at::Tensor()}}); }, {"'u'", "undefined"}));
  EXPECT_TRUE(throws_checkpoint_error(
      [&] {
        save_safetensors(path, {{"m", at::ones({2}, at::TensorOptions().device(at::kMeta))}});
      },
      {"'m'", "meta"}));
  EXPECT_TRUE(throws_checkpoint_error([&] { save_safetensors(path, {{"bad\xff", t}}); }, {path, "UTF-8"}));
  EXPECT_TRUE(throws_checkpoint_error(
      [&] {
        save_safetensors(dir.file("no/such/dir/x.safetensors"), {{"w", t}});
      },
      {"no/such/dir/x.safetensors.tmp.", "No such file or directory"}));
  EXPECT_TRUE(testing::list_dir(dir.path()).empty()) << "a failed save must leave nothing behind";
}

TEST(SafetensorsWriter, OverwritesAnExistingFileAtomically) {
  TempDir dir;
  std::string path = dir.file("w.safetensors");
  save_safetensors(path, {{"w", at::zeros({4})}});
  auto old_file = SafetensorsFile::open(path);
  at::Tensor old_view = old_file.get("w");
  save_safetensors(path, {{"w", at::ones({4})}, {"extra", at::ones({1})}});
  // rename() swapped the directory entry; the old inode, still mapped, is intact.
  EXPECT_TRUE(at::equal(old_view, at::zeros({4})));
  EXPECT_TRUE(at::equal(load_state_dict(path).at("w"), at::ones({4})));
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"w.safetensors"});
}

// --- malformed files: each names the file, the tensor where there is one, and what was expected.

class MalformedFile : public ::testing::Test {
 protected:
  std::string write(const std::string& bytes) {
    testing::write_bytes(path_, bytes);
    return path_;
  }
  std::string write_header(const std::string& header, std::size_t data_bytes = 16) {
    return write(testing::raw_safetensors(header, std::string(data_bytes, '\0')));
  }
  ::testing::AssertionResult rejected(const std::vector<std::string>& parts) {
    std::vector<std::string> all{path_};
    all.insert(all.end(), parts.begin(), parts.end());
    return throws_checkpoint_error([&] { SafetensorsFile::open(path_); }, all);
  }
  TempDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
};

TEST_F(MalformedFile, TooShortForTheLength) {
  write("abc");
  EXPECT_TRUE(rejected({"3 bytes", "too short"}));
  write("");
  EXPECT_TRUE(rejected({"0 bytes"}));
}

TEST_F(MalformedFile, HeaderLengthPastEndOfFile) {
  uint64_t n = 1000;
  write(std::string(reinterpret_cast<char*>(&n), 8) + "{}");
  EXPECT_TRUE(rejected({"header length 1000", "past the end of the file (10 bytes)"}));
  n = ~uint64_t{0};
  write(std::string(reinterpret_cast<char*>(&n), 8) + "{}");
  EXPECT_TRUE(rejected({"header length 18446744073709551615"}));
}

TEST_F(MalformedFile, TruncatedData) {
  save_safetensors(path_, {{"w", at::ones({64})}});
  std::string bytes = testing::read_bytes(path_);
  write(bytes.substr(0, bytes.size() - 10));
  EXPECT_TRUE(rejected({"'w'", "run past the data region of 246 bytes"}));
}

TEST_F(MalformedFile, BadJson) {
  write_header(R"({"w": {"dtype": "F32", )");
  EXPECT_TRUE(rejected({"not valid JSON"}));
  write_header("[1, 2]");
  EXPECT_TRUE(rejected({"header is a JSON array, expected an object"}));
  write_header(
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})");
  EXPECT_TRUE(rejected({"key 'w' twice"}));
  write_header(R"({"w": 3})");
  EXPECT_TRUE(rejected({"'w'", "entry is a JSON number"}));
}

TEST_F(MalformedFile, BadOffsets) {
  write_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})");
  EXPECT_TRUE(rejected({"'w'", "[8, 4] has begin after end"}));
  write_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})");
  EXPECT_TRUE(rejected({"'w'", "run past the data region of 16 bytes"}));
  write_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})");
  EXPECT_TRUE(rejected({"'w'", "data_offsets"}));
  write_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})");
  EXPECT_TRUE(rejected({"'w'", "data_offsets begin must be a non-negative integer, got -4"}));
}

TEST_F(MalformedFile, OverlappingTensors) {
  write_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})");
  EXPECT_TRUE(rejected({"'b'", "[4, 12) overlap tensor 'a' at [0, 8)"}));
}

TEST_F(MalformedFile, DtypeAndShapeMismatches) {
  write_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})");
  EXPECT_TRUE(rejected({"'w'", "F32 [3] needs 3 elements x 4 bytes, but data_offsets [0, 8] span 8 bytes"}));
  write_header(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})");
  EXPECT_TRUE(rejected({"'w'", "unknown dtype \"Q4\"", "supported: F64"}));
  write_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})");
  EXPECT_TRUE(rejected({"'w'", "shape dim must be a non-negative integer, got -1"}));
  write_header(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})");
  EXPECT_TRUE(rejected({"'w'", "got 1.5"}));
  write_header(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
  EXPECT_TRUE(rejected({"'w'", "too many elements"}));
  write_header(R"({"w":{"shape":[1],"data_offsets":[0,4]}})");
  EXPECT_TRUE(rejected({"'w'", "no \"dtype\""}));
  write_header(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})");
  EXPECT_TRUE(rejected({"'w'", "no \"shape\""}));
}

TEST_F(MalformedFile, BadMetadata) {
  write_header(R"({"__metadata__":{"step":12}})");
  EXPECT_TRUE(rejected({"__metadata__ value of 'step' is a JSON number, expected a string"}));
  write_header(R"({"__metadata__":"x"})");
  EXPECT_TRUE(rejected({"__metadata__ must be a JSON object"}));
}

TEST_F(MalformedFile, MissingFileDirectoryAndUnknownTensor) {
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(dir_.file("nope.safetensors")); },
                                      {"nope.safetensors", "No such file"}));
  EXPECT_TRUE(throws_checkpoint_error([&] { SafetensorsFile::open(dir_.path()); }, {"not a regular file"}));
  save_safetensors(path_, {{"a", at::ones({1})}, {"b", at::ones({1})}});
  auto file = SafetensorsFile::open(path_);
  EXPECT_FALSE(file.contains("c"));
  EXPECT_TRUE(throws_checkpoint_error([&] { file.get("c"); }, {path_, "'c'", "no such tensor", "2 tensors (a, b)"}));
  EXPECT_TRUE(throws_checkpoint_error([&] { file.shape("c"); }, {"'c'"}));
}

}  // namespace
}  // namespace colossus::checkpoint
