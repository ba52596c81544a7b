#include "colossus/models/token_layout.h"

#include "colossus/core/errors.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/core/TensorOptions.h>
#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace colossus::models {

namespace {

std::string describe(const at::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), c10::str(t.sizes()));
}

void check_rows(const char* name, const at::Tensor& t) {
  if (t.dim() != 2 || t.size(1) < 1) {
    throw ConfigError(fmt::format("{} must be a (B, T) tensor with T >= 1; got {}", name, describe(t)));
  }
}

}  // namespace

TokenLayout TokenLayout::from_attention_mask(const at::Tensor& attention_mask) {
  check_rows("attention_mask", attention_mask);
  if (attention_mask.is_floating_point() || attention_mask.is_complex()) {
    throw ConfigError(fmt::format("attention_mask must hold 0/1 integers or bools; got {}", describe(attention_mask)));
  }
  const at::Tensor keep = attention_mask.ne(0);
  if (attention_mask.scalar_type() != at::kBool && keep.logical_and(attention_mask.ne(1)).any().item<bool>()) {
    throw ConfigError("attention_mask holds values other than 0 (padding) and 1 (a token)");
  }
  TokenLayout layout;
  layout.document_ids = at::where(keep, 0, -1).to(at::kLong);
  return layout;
}

TokenLayout TokenLayout::from_position_ids(const at::Tensor& position_ids) {
  check_rows("position_ids", position_ids);
  if (position_ids.scalar_type() != at::kLong) {
    throw ConfigError(fmt::format("position_ids must be int64; got {}", describe(position_ids)));
  }
  if (position_ids.lt(0).any().item<bool>()) throw ConfigError("position_ids holds a negative position");
  // A document starts at each position 0, and at the start of every row.
  at::Tensor starts = position_ids.eq(0);
  starts.select(1, 0).fill_(true);
  TokenLayout layout;
  layout.position_ids = position_ids;
  layout.document_ids = at::cumsum(starts, 1, at::kLong) - 1;
  layout.position_limit = position_ids.max().item<int64_t>() + 1;
  return layout;
}

TokenLayout TokenLayout::packed(const std::vector<std::vector<int64_t>>& row_document_lengths, int64_t seq_len) {
  if (row_document_lengths.empty() || seq_len < 1) {
    throw ConfigError(fmt::format("a packed layout needs at least one row and seq_len >= 1; got {} rows, seq_len {}",
                                  row_document_lengths.size(), seq_len));
  }
  const auto batch = static_cast<int64_t>(row_document_lengths.size());
  at::Tensor positions = at::zeros({batch, seq_len}, at::kLong);
  at::Tensor documents = at::full({batch, seq_len}, -1, at::kLong);
  auto pos = positions.accessor<int64_t, 2>();
  auto doc = documents.accessor<int64_t, 2>();
  int64_t longest = 1;
  for (int64_t row = 0; row < batch; ++row) {
    int64_t t = 0, id = 0;
    for (const int64_t length : row_document_lengths[static_cast<size_t>(row)]) {
      if (length < 1 || t + length > seq_len) {
        throw ConfigError(fmt::format("packed row {}: a document of {} tokens at offset {} does not fit seq_len {}",
                                      row, length, t, seq_len));
      }
      for (int64_t i = 0; i < length; ++i, ++t) {
        pos[row][t] = i;
        doc[row][t] = id;
      }
      longest = std::max(longest, length);
      ++id;
    }
  }
  return TokenLayout{.position_ids = positions, .document_ids = documents, .position_limit = longest};
}

void TokenLayout::check_against(const at::Tensor& input_ids) const {
  for (const auto& [name, t] : {std::pair{"position_ids", &position_ids}, std::pair{"document_ids", &document_ids}}) {
    if (!t->defined()) continue;
    if (t->scalar_type() != at::kLong || !t->sizes().equals(input_ids.sizes())) {
      throw ConfigError(fmt::format("{} must be int64 and shaped like input_ids {}; got {}", name,
                                    c10::str(input_ids.sizes()), describe(*t)));
    }
  }
  if (position_ids.defined() && position_limit < 1) {
    throw ConfigError(fmt::format("a layout with position_ids needs position_limit >= 1 (1 + the largest position); got {}",
                                  position_limit));
  }
}

TokenLayout TokenLayout::rows(int64_t begin, int64_t count) const {
  TokenLayout part = *this;
  if (part.position_ids.defined()) part.position_ids = part.position_ids.narrow(0, begin, count);
  if (part.document_ids.defined()) part.document_ids = part.document_ids.narrow(0, begin, count);
  return part;
}

TokenLayout TokenLayout::to(const at::Device& device) const {
  TokenLayout moved = *this;
  if (moved.position_ids.defined()) moved.position_ids = moved.position_ids.to(device);
  if (moved.document_ids.defined()) moved.document_ids = moved.document_ids.to(device);
  return moved;
}

at::Tensor TokenLayout::positions(int64_t batch, int64_t seq_len, const at::Device& device) const {
  if (position_ids.defined()) return position_ids;
  return at::arange(seq_len, at::TensorOptions().dtype(at::kLong).device(device)).expand({batch, seq_len});
}

at::Tensor TokenLayout::attention_mask() const {
  if (!document_ids.defined()) return {};
  const int64_t seq_len = document_ids.size(1);
  const auto bools = at::TensorOptions().dtype(at::kBool).device(document_ids.device());
  const at::Tensor same_document = document_ids.unsqueeze(2).eq(document_ids.unsqueeze(1));  // (B, Tq, Tk)
  const at::Tensor real_key = document_ids.ge(0).unsqueeze(1);                                 // (B, 1, Tk)
  const at::Tensor causal = at::ones({seq_len, seq_len}, bools).tril();
  return same_document.logical_and(real_key).logical_and(causal).logical_or(at::eye(seq_len, bools)).unsqueeze(1);
}

}  // namespace colossus::models
