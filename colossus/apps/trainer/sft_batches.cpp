#include "colossus/apps/trainer/sft_batches.h"

#include "colossus/core/errors.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>

namespace colossus::apps {

namespace {

int64_t count_targets(const at::Tensor& labels) {
  return labels.narrow(1, 1, labels.size(1) - 1).ne(-100).sum().item<int64_t>();
}

// Writes `example` into row `row` of ids/labels from column `offset`. Its
// first token is no target: at a row's start the loss never predicts it, and
// in a packed row the previous example would.
void place(const data::SftExample& example, int64_t row, int64_t offset, at::Tensor& ids, at::Tensor& labels) {
  auto id = ids.accessor<int64_t, 2>();
  auto label = labels.accessor<int64_t, 2>();
  for (size_t i = 0; i < example.input_ids.size(); ++i) {
    const int64_t t = offset + static_cast<int64_t>(i);
    id[row][t] = example.input_ids[i];
    label[row][t] = (i > 0 && example.trained[i] != 0) ? example.input_ids[i] : -100;
  }
}

void check_examples(const std::vector<data::SftExample>& examples) {
  if (examples.empty()) throw ConfigError("an SFT batch needs at least one example");
  for (const auto& example : examples) {
    if (example.input_ids.empty() || example.input_ids.size() != example.trained.size()) {
      throw ConfigError(fmt::format("an SFT example has {} ids and {} trained flags; both must be equal and > 0",
                                    example.input_ids.size(), example.trained.size()));
    }
  }
}

}  // namespace

SftBatch pad_batch(const std::vector<data::SftExample>& examples, int32_t pad_id) {
  check_examples(examples);
  size_t longest = 0;
  for (const auto& example : examples) longest = std::max(longest, example.input_ids.size());
  const auto rows = static_cast<int64_t>(examples.size()), seq_len = static_cast<int64_t>(longest);
  SftBatch batch;
  batch.input_ids = at::full({rows, seq_len}, pad_id, at::kLong);
  batch.labels = at::full({rows, seq_len}, -100, at::kLong);
  at::Tensor attention_mask = at::full({rows, seq_len}, 0, at::kLong);
  batch.example_ids = at::full({rows, seq_len}, -1, at::kLong);
  for (int64_t row = 0; row < rows; ++row) {
    const auto& example = examples[static_cast<size_t>(row)];
    place(example, row, 0, batch.input_ids, batch.labels);
    attention_mask[row].narrow(0, 0, static_cast<int64_t>(example.input_ids.size())).fill_(1);
    batch.example_ids[row].narrow(0, 0, static_cast<int64_t>(example.input_ids.size())).fill_(row);
  }
  batch.layout = models::TokenLayout::from_attention_mask(attention_mask);
  batch.targets = count_targets(batch.labels);
  return batch;
}

SftBatch pack_batch(const std::vector<data::SftExample>& examples, int64_t seq_len, int32_t pad_id) {
  check_examples(examples);
  std::vector<std::vector<int64_t>> rows(1);
  int64_t used = 0;
  for (const auto& example : examples) {
    const auto length = static_cast<int64_t>(example.input_ids.size());
    if (length > seq_len) {
      throw ConfigError(fmt::format("an SFT example of {} tokens does not fit a packed row of seq_len {}; set "
                                    "data.max_length <= seq_len",
                                    length, seq_len));
    }
    if (used + length > seq_len) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(length);
    used += length;
  }
  SftBatch batch;
  const auto row_count = static_cast<int64_t>(rows.size());
  batch.input_ids = at::full({row_count, seq_len}, pad_id, at::kLong);
  batch.labels = at::full({row_count, seq_len}, -100, at::kLong);
  batch.example_ids = at::full({row_count, seq_len}, -1, at::kLong);
  size_t next = 0;
  for (int64_t row = 0; row < row_count; ++row) {
    int64_t offset = 0;
    for (const int64_t length : rows[static_cast<size_t>(row)]) {
      batch.example_ids[row].narrow(0, offset, length).fill_(static_cast<int64_t>(next));
      place(examples[next++], row, offset, batch.input_ids, batch.labels);
      offset += length;
    }
  }
  batch.layout = models::TokenLayout::packed(rows, seq_len);
  batch.targets = count_targets(batch.labels);
  return batch;
}

SftBatch concat_batches(const std::vector<SftBatch>& batches, int32_t pad_id) {
  if (batches.empty()) throw ConfigError("concat_batches: no batches");
  int64_t longest = 0, position_limit = 0;
  for (const auto& batch : batches) longest = std::max(longest, batch.input_ids.size(1));
  std::vector<at::Tensor> ids, labels, positions, documents, examples;
  int64_t examples_before = 0;
  SftBatch whole;
  for (const auto& batch : batches) {
    const int64_t rows = batch.input_ids.size(0), len = batch.input_ids.size(1), pad = longest - len;
    const auto& layout = batch.layout;
    ids.push_back(at::constant_pad_nd(batch.input_ids, {0, pad}, pad_id));
    labels.push_back(at::constant_pad_nd(batch.labels, {0, pad}, -100));
    positions.push_back(at::constant_pad_nd(layout.positions(rows, len, batch.input_ids.device()), {0, pad}, 0));
    const at::Tensor docs = layout.document_ids.defined() ? layout.document_ids : at::zeros({rows, len}, at::kLong);
    documents.push_back(at::constant_pad_nd(docs, {0, pad}, -1));
    if (batch.example_ids.defined()) {
      // Indices continue over the batches (the examples of all of them, in order).
      const at::Tensor shifted = at::where(batch.example_ids.ge(0), batch.example_ids + examples_before, -1);
      examples.push_back(at::constant_pad_nd(shifted, {0, pad}, -1));
      examples_before += batch.example_ids.max().item<int64_t>() + 1;
    }
    position_limit = std::max(position_limit, layout.position_ids.defined() ? layout.position_limit : len);
    whole.targets += batch.targets;
  }
  whole.input_ids = at::cat(ids, 0);
  whole.labels = at::cat(labels, 0);
  whole.layout.position_ids = at::cat(positions, 0);
  whole.layout.document_ids = at::cat(documents, 0);
  whole.layout.position_limit = position_limit;
  if (examples.size() == batches.size()) whole.example_ids = at::cat(examples, 0);
  return whole;
}

}  // namespace colossus::apps
