// Interoperability with the reference implementations, both ways: Python's
// safetensors package reads what we write (and re-writes it byte for byte),
// we read what it writes, and transformers loads our sharded checkpoints
// while we load its.
#include "colossus/checkpoint/safetensors.h"
#include "tests/checkpoint/test_util.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace colossus::checkpoint {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

#define REQUIRE_PYTHON() \
  if (!testing::python_available()) GTEST_SKIP() << "no Python oracle at " COLOSSUS_PYTHON

void run_or_fail(const std::string& script) {
  std::string output;
  int status = testing::run_python(script, output);
  ASSERT_EQ(status, 0) << "Python oracle failed:\n" << output;
}

TEST(PythonOracle, PythonReadsOurFileAndRewritesItByteForByte) {
  REQUIRE_PYTHON();
  TempDir dir;
  NamedTensors tensors;
  int64_t seed = 3;
  for (const auto& [name, dtype] : testing::all_dtypes()) {
    tensors.emplace_back(name + ".matrix", testing::sample_tensor(dtype, {4, 3}, seed++));
    tensors.emplace_back(name + ".scalar", testing::sample_tensor(dtype, {}, seed++));
    tensors.emplace_back(name + ".empty", testing::sample_tensor(dtype, {0, 3}, seed++));
  }
  tensors.emplace_back("known.f32", at::arange(12, at::kFloat).reshape({3, 4}).t());  // non-contiguous
  tensors.emplace_back("known.bf16", at::arange(6, at::kFloat).to(at::kBFloat16) / 4);
  tensors.emplace_back("known.bool", at::tensor({1, 0, 0, 1}).to(at::kBool));
  tensors.emplace_back("known.i64", at::scalar_tensor(-5, at::kLong));
  std::string ours = dir.file("ours.safetensors");
  std::string theirs = dir.file("theirs.safetensors");
  save_safetensors(ours, tensors, {{"format", "pt"}});  // one key: Rust's HashMap order is then fixed

  run_or_fail(fmt::format(R"(
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
t = load_file("{0}")
with safe_open("{0}", "pt") as f:
    meta = f.metadata()
assert meta == {{"format": "pt"}}, meta
assert len(t) == {2}, len(t)
assert torch.equal(t["known.f32"], torch.arange(12, dtype=torch.float32).reshape(3, 4).t().contiguous())
assert torch.equal(t["known.bf16"], torch.arange(6, dtype=torch.float32).to(torch.bfloat16) / 4)
assert t["known.bool"].tolist() == [True, False, False, True]
assert t["known.i64"].shape == () and t["known.i64"].item() == -5
assert t["F8_E4M3.matrix"].dtype == torch.float8_e4m3fn and t["U16.matrix"].dtype == torch.uint16
assert t["C64.empty"].shape == (0, 3) and t["C64.empty"].dtype == torch.complex64
save_file(t, "{1}", metadata=meta)
)",
                          ours, theirs, tensors.size()));
  EXPECT_EQ(testing::read_bytes(ours), testing::read_bytes(theirs))
      << "the safetensors package re-encoded our tensors differently";
}

TEST(PythonOracle, WeReadWhatPythonWrites) {
  REQUIRE_PYTHON();
  TempDir dir;
  std::string path = dir.file("py.safetensors");
  run_or_fail(fmt::format(R"(
import torch
from safetensors.torch import save_file
save_file({{
    "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "f64": torch.tensor([1.5, -2.25], dtype=torch.float64),
    "f16": torch.tensor([0.5, 65504.0], dtype=torch.float16),
    "bf16": torch.tensor([[1.0, -3.0], [0.125, 2.0]]).to(torch.bfloat16),
    "i64": torch.tensor([-3, 2**40]),
    "i32": torch.tensor([7, -8], dtype=torch.int32),
    "i16": torch.tensor([-300], dtype=torch.int16),
    "i8": torch.tensor([-128, 127], dtype=torch.int8),
    "u8": torch.tensor([0, 255], dtype=torch.uint8),
    "u16": torch.tensor([65535, 1]).to(torch.uint16),
    "bool": torch.tensor([True, False, True]),
    "fp8_e4m3": torch.tensor([0.5, -1.0, 448.0]).to(torch.float8_e4m3fn),
    "fp8_e5m2": torch.tensor([0.25, -2.0]).to(torch.float8_e5m2),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 5),
    "c64": torch.complex(torch.tensor([1.0]), torch.tensor([-1.0])),
}}, "{}", metadata={{"format": "pt", "origin": "python"}})
)",
                          path));
  NamedTensors want{
      {"f32", at::arange(12, at::kFloat).reshape({3, 4})},
      {"f64", at::tensor({1.5, -2.25}, at::kDouble)},
      {"f16", at::tensor({0.5, 65504.0}).to(at::kHalf)},
      {"bf16", at::tensor({1.0f, -3.0f, 0.125f, 2.0f}).reshape({2, 2}).to(at::kBFloat16)},
      {"i64", at::tensor({int64_t{-3}, int64_t{1} << 40})},
      {"i32", at::tensor({7, -8}, at::kInt)},
      {"i16", at::tensor({-300}).to(at::kShort)},
      {"i8", at::tensor({-128, 127}).to(at::kChar)},
      {"u8", at::tensor({0, 255}).to(at::kByte)},
      {"u16", at::tensor({65535, 1}).to(at::kUInt16)},
      {"bool", at::tensor({1, 0, 1}).to(at::kBool)},
      {"fp8_e4m3", at::tensor({0.5f, -1.0f, 448.0f}).to(at::kFloat8_e4m3fn)},
      {"fp8_e5m2", at::tensor({0.25f, -2.0f}).to(at::kFloat8_e5m2)},
      {"scalar", at::scalar_tensor(3.5, at::kFloat)},
      {"empty", at::zeros({0, 5})},
      {"c64", at::complex(at::tensor({1.0f}), at::tensor({-1.0f}))},
  };
  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"origin", "python"}}));
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(path), want));
}

TEST(PythonOracle, TransformersAndWeLoadEachOthersShardedCheckpoints) {
  REQUIRE_PYTHON();
  TempDir dir;
  std::string hf_single = dir.file("hf_single");
  std::string hf_sharded = dir.file("hf_sharded");
  std::string ours = dir.file("ours");
  // A tiny GPT-2 saved by transformers itself, once whole and once sharded.
  run_or_fail(fmt::format(R"(
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
model.save_pretrained("{}")
model.save_pretrained("{}", max_shard_size="20KB")
)",
                          hf_single, hf_sharded));
  auto reference = load_state_dict(hf_single);
  ASSERT_GT(reference.size(), 20u);
  NamedTensors expected(reference.begin(), reference.end());
  auto from_shards = load_state_dict(hf_sharded);
  EXPECT_NO_THROW(check_state_dict(from_shards, expected, /*strict=*/true));
  EXPECT_TRUE(testing::same_state_dict(from_shards, expected));

  save_sharded(ours, expected, {.max_shard_bytes = 20000});
  fs::copy_file(fs::path(hf_single) / "config.json", fs::path(ours) / "config.json");
  int shards = 0;
  for (const auto& name : testing::list_dir(ours)) shards += name.starts_with("model-0") ? 1 : 0;
  ASSERT_GT(shards, 3);

  run_or_fail(fmt::format(R"(
import json, os, torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel
ref = GPT2LMHeadModel.from_pretrained("{0}")
model, info = GPT2LMHeadModel.from_pretrained("{1}", output_loading_info=True)
assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
for (name, a), (name2, b) in zip(ref.state_dict().items(), model.state_dict().items()):
    assert name == name2 and torch.equal(a, b), name
x = torch.tensor([[1, 2, 3, 4]])
assert torch.equal(ref(x).logits, model(x).logits)
# What transformers' sharded loader does by hand: index, then every shard.
index = json.load(open(os.path.join("{1}", "model.safetensors.index.json")))
files = sorted(set(index["weight_map"].values()))
assert len(files) == {2}, files
loaded = {{}}
for f in files:
    loaded.update(load_file(os.path.join("{1}", f)))
assert set(loaded) == set(index["weight_map"])
assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in loaded.values())
single = load_file(os.path.join("{0}", "model.safetensors"))
assert set(single) == set(loaded) and all(torch.equal(single[k], loaded[k]) for k in single)
)",
                          hf_single, ours, shards));
}

}  // namespace
}  // namespace colossus::checkpoint
