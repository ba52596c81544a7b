// SFT batches: padded and packed layouts of the same examples (ids, labels,
// positions, documents, target counts), and the loss a model computes on
// either is the same per-token mean; bad input refused by name.
#include "colossus/apps/trainer/sft_batches.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace colossus::apps {
namespace {

at::Tensor longs(std::vector<int64_t> values, int64_t rows) {
  return at::tensor(values, at::kLong).view({rows, -1});
}

data::SftExample example(std::vector<int32_t> ids, std::vector<uint8_t> trained) {
  return {.input_ids = std::move(ids), .trained = std::move(trained)};
}

// Three examples: the first token of each is a prompt token (untrained) in the first two.
std::vector<data::SftExample> examples() {
  return {example({5, 6, 7, 8}, {0, 0, 1, 1}), example({9, 10, 11}, {0, 1, 1}), example({12, 13, 14, 15, 16}, {1, 1, 1, 1, 1})};
}

TEST(SftBatches, PaddedRowsOneExampleEach) {
  const SftBatch batch = pad_batch(examples(), /*pad_id=*/0);
  EXPECT_TRUE(at::equal(batch.input_ids, longs({5, 6, 7, 8, 0, 9, 10, 11, 0, 0, 12, 13, 14, 15, 16}, 3)));
  EXPECT_TRUE(at::equal(batch.labels, longs({-100, -100, 7, 8, -100, -100, 10, 11, -100, -100, -100, 13, 14, 15, 16}, 3)));
  EXPECT_FALSE(batch.layout.position_ids.defined());
  EXPECT_TRUE(at::equal(batch.layout.document_ids, longs({0, 0, 0, 0, -1, 0, 0, 0, -1, -1, 0, 0, 0, 0, 0}, 3)));
  EXPECT_EQ(batch.targets, 2 + 2 + 4);
}

TEST(SftBatches, PackedRowsRestartPositionsAndNeverPredictAcrossExamples) {
  const SftBatch batch = pack_batch(examples(), /*seq_len=*/8, /*pad_id=*/0);
  // Row 0: examples 0 and 1 (7 tokens) and one pad; row 1: example 2 and padding.
  EXPECT_TRUE(at::equal(batch.input_ids, longs({5, 6, 7, 8, 9, 10, 11, 0, 12, 13, 14, 15, 16, 0, 0, 0}, 2)));
  EXPECT_TRUE(at::equal(batch.labels, longs({-100, -100, 7, 8, -100, 10, 11, -100, -100, 13, 14, 15, 16, -100, -100, -100}, 2)));
  EXPECT_TRUE(at::equal(batch.layout.position_ids, longs({0, 1, 2, 3, 0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 0, 0}, 2)));
  EXPECT_TRUE(at::equal(batch.layout.document_ids, longs({0, 0, 0, 0, 1, 1, 1, -1, 0, 0, 0, 0, 0, -1, -1, -1}, 2)));
  EXPECT_EQ(batch.layout.position_limit, 5);
  EXPECT_EQ(batch.targets, 2 + 2 + 4);
}

TEST(SftBatches, PaddedAndPackedGiveTheSameLoss) {
  for (const char* name : {"llama-tiny", "gpt2-tiny"}) {
    auto model = models::create_model(models::preset(name), {.seed = 5});
    model->eval();
    const SftBatch padded = pad_batch(examples(), 0), packed = pack_batch(examples(), 8, 0);
    const at::Tensor a = model->forward_loss(padded.input_ids, padded.labels, std::nullopt, padded.layout);
    const at::Tensor b = model->forward_loss(packed.input_ids, packed.labels, std::nullopt, packed.layout);
    EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6)) << name << ": " << a.item<double>() << " vs " << b.item<double>();
    // The per-token mean over the batch's targets: the sum over num_items = targets.
    const at::Tensor summed = model->forward_loss(packed.input_ids, packed.labels, packed.targets, packed.layout);
    EXPECT_TRUE(at::allclose(summed, b, 1e-6, 1e-7)) << name;
  }
}

TEST(SftBatches, BadInputIsRefusedByName) {
  try {
    pack_batch(examples(), /*seq_len=*/4, 0);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("an SFT example of 5 tokens does not fit a packed row of seq_len 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(pad_batch({}, 0), ConfigError);
  EXPECT_THROW(pad_batch({example({1, 2}, {1})}, 0), ConfigError);
}

}  // namespace
}  // namespace colossus::apps
