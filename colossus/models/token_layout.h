// Where the tokens of a (B, T) batch sit when a row is not one plain causal
// sequence: padded rows (HF's attention_mask) and packed rows (several
// documents, positions restarting at each). The model's forward takes it
// beside input_ids; an empty layout is the plain causal LM.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace colossus::models {

struct TokenLayout {
  // (B, T) int64: each token's position (its RoPE angle, GPT-2's position
  // row). Undefined: 0..T-1 in every row.
  at::Tensor position_ids;
  // (B, T) int64: the document of each token. A token attends to itself and
  // to earlier tokens of its own document; a negative id is padding (seen by
  // no other token; it attends to itself only, so no row of scores is empty).
  // Undefined: one document per row.
  at::Tensor document_ids;
  // 1 + the largest position (a host-side bound: RoPE tables are sized and
  // dynamic/longrope scaling chosen by it, as transformers does by the
  // sequence's largest position). Set with position_ids.
  int64_t position_limit = 0;

  bool empty() const { return !position_ids.defined() && !document_ids.defined(); }

  // HF's padded batch: attention_mask (B, T) of 0/1 (int or bool), 0 marks
  // padding, on either side; positions 0..T-1 in every row as transformers'
  // forward takes them when no position_ids are given.
  static TokenLayout from_attention_mask(const at::Tensor& attention_mask);
  // Packed rows in HF's padding-free convention (DataCollatorWithFlattening):
  // position_ids (B, T) int64 restart at 0 where a document starts.
  static TokenLayout from_position_ids(const at::Tensor& position_ids);
  // Packed rows from document lengths per row (each row's lengths summing to
  // at most T; the rest of the row is padding): positions restart at 0 for
  // every document.
  static TokenLayout packed(const std::vector<std::vector<int64_t>>& row_document_lengths, int64_t seq_len);

  // Throws ConfigError unless the tensors are (B, T) int64 like input_ids
  // and position_limit covers position_ids.
  void check_against(const at::Tensor& input_ids) const;
  // The same layout for rows [begin, begin + count) (a pipeline micro-batch).
  TokenLayout rows(int64_t begin, int64_t count) const;
  // On `device` (the ids' device; a CPU-built layout moves with its batch).
  TokenLayout to(const at::Device& device) const;

  // (B, T) int64 positions: position_ids, or 0..T-1 expanded.
  at::Tensor positions(int64_t batch, int64_t seq_len, const at::Device& device) const;
  // (B, 1, T, T) bool, true where query i may attend key j: j <= i in the
  // same document, or j == i. Undefined when document_ids is.
  at::Tensor attention_mask() const;
};

}  // namespace colossus::models
