// TokenLayout: padded and packed rows as attention masks and positions, the
// three ways of building one agreeing, bad input refused by name, and a
// layout of plain rows giving the plain forward.
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/models/token_layout.h"
#include "tests/models/oracle.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <string>

namespace colossus::models {
namespace {

at::Tensor longs(std::initializer_list<int64_t> values, int64_t rows) {
  return at::tensor(std::vector<int64_t>(values), at::kLong).view({rows, -1});
}

template <typename Fn>
std::string config_error(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(TokenLayout, AttentionMaskKeepsPaddingOutOfEveryRealTokensView) {
  // Row 0: two tokens then padding; row 1: padding then three tokens.
  const auto layout = TokenLayout::from_attention_mask(longs({1, 1, 0, 0, 0, 1, 1, 1}, 2));
  EXPECT_FALSE(layout.position_ids.defined());  // positions 0..T-1, as transformers' forward
  EXPECT_TRUE(at::equal(layout.document_ids, longs({0, 0, -1, -1, -1, 0, 0, 0}, 2)));
  const at::Tensor mask = layout.attention_mask();
  ASSERT_EQ(mask.sizes(), (c10::IntArrayRef{2, 1, 4, 4}));
  // Query rows: causal over real keys; a padding query sees itself only.
  const at::Tensor expected = longs({1, 0, 0, 0,  //
                                     1, 1, 0, 0,  //
                                     0, 0, 1, 0,  //
                                     0, 0, 0, 1,  //
                                                  // row 1
                                     1, 0, 0, 0,  //
                                     0, 1, 0, 0,  //
                                     0, 1, 1, 0,  //
                                     0, 1, 1, 1},
                                    2)
                                  .view({2, 1, 4, 4})
                                  .to(at::kBool);
  EXPECT_TRUE(at::equal(mask, expected)) << mask;
}

TEST(TokenLayout, PackedRowsRestartPositionsAndMatchHfPositionIds) {
  const auto packed = TokenLayout::packed({{2, 3}, {4}}, 5);
  EXPECT_TRUE(at::equal(packed.position_ids, longs({0, 1, 0, 1, 2, 0, 1, 2, 3, 0}, 2)));
  EXPECT_TRUE(at::equal(packed.document_ids, longs({0, 0, 1, 1, 1, 0, 0, 0, 0, -1}, 2)));
  EXPECT_EQ(packed.position_limit, 4);
  // HF's padding-free convention reads the positions alone: documents start
  // at position 0 (the trailing padding becomes its own document, which no
  // other token sees either), so the attention is the same.
  const auto from_positions = TokenLayout::from_position_ids(packed.position_ids);
  EXPECT_EQ(from_positions.position_limit, 4);
  EXPECT_TRUE(at::equal(from_positions.attention_mask(), packed.attention_mask()));
  // A row that does not start at position 0 still starts a document.
  EXPECT_TRUE(at::equal(TokenLayout::from_position_ids(longs({3, 4, 0, 1}, 1)).document_ids, longs({0, 0, 1, 1}, 1)));
  // Micro-batch rows keep their own documents.
  EXPECT_TRUE(at::equal(packed.rows(1, 1).document_ids, longs({0, 0, 0, 0, -1}, 1)));
}

TEST(TokenLayout, BadInputIsRefusedByName) {
  EXPECT_NE(config_error([] { TokenLayout::from_attention_mask(longs({1, 2, 0, 1}, 2)); }).find("0 (padding) and 1"),
            std::string::npos);
  EXPECT_NE(config_error([] { TokenLayout::from_attention_mask(at::ones({2, 3}, at::kFloat)); }).find("attention_mask"),
            std::string::npos);
  EXPECT_NE(config_error([] { TokenLayout::from_position_ids(longs({0, -1}, 1)); }).find("negative"), std::string::npos);
  EXPECT_NE(config_error([] { TokenLayout::packed({{3, 3}}, 5); }).find("does not fit seq_len 5"), std::string::npos);
  auto model = create_model(preset("llama-tiny"), {.seed = 1});
  const at::Tensor ids = testing::random_ids(2, 6, 64, 3);
  const std::string wrong_shape = config_error([&] { model->forward(ids, TokenLayout::packed({{6}}, 6)); });
  EXPECT_NE(wrong_shape.find("position_ids must be int64 and shaped like input_ids [2, 6]"), std::string::npos)
      << wrong_shape;
}

TEST(TokenLayout, PlainRowsGiveThePlainForward) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "gemma2-tiny"}) {
    auto model = create_model(preset(name), {.seed = 2});
    model->eval();
    const at::Tensor ids = testing::random_ids(2, 12, 64, 4);
    const at::Tensor plain = model->forward(ids);
    for (const TokenLayout& layout : {TokenLayout::packed({{12}, {12}}, 12),
                                      TokenLayout::from_attention_mask(at::ones({2, 12}, at::kLong))}) {
      EXPECT_TRUE(at::allclose(model->forward(ids, layout), plain, 1e-5, 1e-6)) << name;
    }
  }
}

}  // namespace
}  // namespace colossus::models
