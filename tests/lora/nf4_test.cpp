// NF4 (QLoRA's 4-bit base weights) against bitsandbytes' own quantiser
// (nf4_oracle.py): the packed codes, the block absmaxes and the dequantised
// weights (fp32) are equal, for whole and partial blocks and bf16 input;
// with double quantisation the offset and group scales are equal and the
// 8-bit absmax codes agree but for rare near-ties, one code apart;
// the code book is the published one; the storage is about half a byte a
// weight. nf4_linear (the autograd function Nf4Linear runs on CUDA) equals
// the reference on the CPU, forward and backward.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/lora/nf4.h"
#include "colossus/lora/nf4_matmul.h"
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

// On the CPU nf4_linear dequantises with ATen like the reference, in the
// forward and again in the backward; y, grad_x and grad_bias must equal
// at::linear's autograd on dequantize_nf4's weight bit for bit, for a row
// count the CUDA path sends to the fused gemv (3) and one it does not (20).
TEST(Nf4, LinearFunctionEqualsReferenceOnCpu) {
  at::manual_seed(5);
  const at::Tensor base = at::randn({24, 128}) * 0.05;
  for (bool double_quant : {false, true}) {
    const Nf4Tensor weight = quantize_nf4(base, 64, double_quant);
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t rows : {3, 20}) {
        SCOPED_TRACE(fmt::format("double_quant {} {} rows {}", double_quant, c10::toString(dtype), rows));
        const at::Tensor x0 = at::randn({1, rows, 128}).to(dtype);
        const at::Tensor bias0 = at::randn({24}).to(dtype);
        const at::Tensor grad_y = at::randn({1, rows, 24}).to(dtype);
        at::Tensor x = x0.clone().requires_grad_(true), bias = bias0.clone().requires_grad_(true);
        const at::Tensor y = nf4_linear(x, weight, at::Tensor(), bias);
        y.backward(grad_y);
        at::Tensor x_ref = x0.clone().requires_grad_(true), bias_ref = bias0.clone().requires_grad_(true);
        const at::Tensor y_ref = at::linear(x_ref, dequantize_nf4(weight, dtype), bias_ref);
        y_ref.backward(grad_y);
        EXPECT_TRUE(at::equal(y, y_ref));
        EXPECT_TRUE(at::equal(x.grad(), x_ref.grad()));
        EXPECT_TRUE(at::equal(bias.grad(), bias_ref.grad()));
      }
    }
  }
  // Without a bias, and with x frozen: no gradient is asked for.
  const Nf4Tensor weight = quantize_nf4(base);
  const at::Tensor x = at::randn({5, 128});
  const at::Tensor y = nf4_linear(x, weight, at::Tensor(), at::Tensor());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(at::equal(y, at::linear(x, dequantize_nf4(weight, at::kFloat))));
  EXPECT_THROW(nf4_linear(at::randn({5, 64}), weight, at::Tensor(), at::Tensor()), c10::Error);
}

}  // namespace
}  // namespace colossus::lora
