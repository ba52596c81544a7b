// NF4 (QLoRA's 4-bit base weights) against bitsandbytes' own quantiser
// (nf4_oracle.py): the packed codes, the block absmaxes and the dequantised
// weights (fp32) are equal, for whole and partial blocks and bf16 input;
// with double quantisation the offset and group scales are equal and the
// 8-bit absmax codes agree but for rare near-ties, one code apart;
// the code book is the published one; the storage is about half a byte a
// weight.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/lora/nf4.h"
#include "tests/testing/command.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

namespace colossus::lora {
namespace {

namespace fs = std::filesystem;

TEST(Nf4, QuantisesAsBitsandbytes) {
  const fs::path dir = colossus::testing::scratch_dir("nf4_test");
  at::manual_seed(3);
  const std::map<std::string, at::Tensor> weights = {
      {"whole_blocks", at::randn({128, 64}) * 0.02},
      {"partial_block", at::randn({37, 23})},  // 851 values: an odd count and a last block of 19
      {"bf16", (at::randn({48, 128}) * 0.1).to(at::kBFloat16)},
      {"many_blocks", at::randn({300, 256}) * 0.05}};  // 1200 blocks: 5 groups of absmaxes, the last partial
  checkpoint::NamedTensors named(weights.begin(), weights.end());
  checkpoint::save_safetensors((dir / "in.safetensors").string(), named);
  // TORCHDYNAMO_DISABLE: bitsandbytes would torch.compile its reference kernels (a minute on CPU).
  const auto result = colossus::testing::run_command(fmt::format("TORCHDYNAMO_DISABLE=1 '{}' '{}' '{}' '{}' 2>&1", COLOSSUS_PYTHON,
                                                                 COLOSSUS_NF4_ORACLE, (dir / "in.safetensors").string(),
                                                                 (dir / "out.safetensors").string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto bnb = checkpoint::load_state_dict((dir / "out.safetensors").string(), "");
  for (const auto& [name, weight] : weights) {
    SCOPED_TRACE(name);
    // The NF4 codes and block absmaxes: bit for bit.
    const Nf4Tensor plain = quantize_nf4(weight, 64, /*double_quant=*/false);
    EXPECT_TRUE(at::equal(plain.packed, bnb.at(name + ".packed")));
    EXPECT_TRUE(at::equal(plain.absmax, bnb.at(name + ".absmax")));
    EXPECT_TRUE(at::equal(dequantize_nf4(plain, at::kFloat), bnb.at(name + ".dequantized")));
    // Double quantisation: the same offset and group scales; the 8-bit codes
    // of the block absmaxes are the nearest dynamic-map values, where
    // bitsandbytes' CPU kernel picks the other neighbour at a few near-ties:
    // a few (at most 2%, or 8 of a small tensor), one code apart, moving the
    // block's scale by less than 1% of the group's.
    const Nf4Tensor nested = quantize_nf4(weight);
    EXPECT_TRUE(at::equal(nested.packed, bnb.at(name + ".dq.packed")));
    EXPECT_TRUE(at::equal(nested.absmax_scale, bnb.at(name + ".dq.absmax_scale")));
    EXPECT_EQ(static_cast<float>(nested.offset), bnb.at(name + ".dq.offset").item<float>());
    const at::Tensor code_steps = (nested.absmax.to(at::kInt) - bnb.at(name + ".dq.absmax").to(at::kInt)).abs();
    EXPECT_LE(code_steps.max().item<int>(), 1);
    EXPECT_LE(code_steps.sum().item<int>(), std::max<int64_t>(8, nested.absmax.numel() / 50));
    const at::Tensor diff = (dequantize_nf4(nested, at::kFloat) - bnb.at(name + ".dq.dequantized")).abs();
    EXPECT_LE(diff.max().item<float>(), 0.01 * nested.absmax_scale.max().item<float>());
    // About half a byte a weight: 4 bits, plus one byte of absmax per 64 weights.
    EXPECT_LE(static_cast<double>(nested.bytes()) / static_cast<double>(weight.numel()), 0.53);
  }
}

TEST(Nf4, CodeBookAndBadInput) {
  const auto& code = nf4_code();
  EXPECT_EQ(code.front(), -1.0f);
  EXPECT_EQ(code[7], 0.0f);
  EXPECT_EQ(code.back(), 1.0f);
  EXPECT_TRUE(std::is_sorted(code.begin(), code.end()));
  // A block holding exactly the code values (times its absmax) comes back exact.
  const at::Tensor exact = at::tensor(std::vector<float>(code.begin(), code.end())).repeat({4}) * 0.5;
  EXPECT_TRUE(at::equal(dequantize_nf4(quantize_nf4(exact, 64, false), at::kFloat), exact));
  const at::Tensor map = dynamic_map();
  EXPECT_EQ(map.numel(), 256);
  EXPECT_EQ(map.max().item<float>(), 1.0f);
  EXPECT_THROW(quantize_nf4(at::ones({8}), 48), ConfigError);
  EXPECT_THROW(quantize_nf4(at::ones({8}, at::kLong)), ConfigError);
}

}  // namespace
}  // namespace colossus::lora
