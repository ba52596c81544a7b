// SFT examples (data/sft_examples.h) as a model batch: ids, labels (-100
// where no target) and the TokenLayout that keeps examples apart, either one
// example a row padded to the longest (TRL's default collator) or several
// examples packed into each row with positions restarting (padding-free).
#pragma once
#include "colossus/data/sft_examples.h"
#include "colossus/models/token_layout.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace colossus::apps {

struct SftBatch {
  at::Tensor input_ids;  // (B, T) int64
  at::Tensor labels;     // (B, T) int64: the token where it is a target, else -100
  models::TokenLayout layout;
  int64_t targets = 0;  // labels that count in the causal-LM loss (after each row's first position)
  // (B, T) int64: the index (in the examples given) of the example each
  // token belongs to; -1 for padding. DPO sums log-probs per example.
  at::Tensor example_ids;
};

// One example a row, padded on the right to the longest with pad_id (labels
// -100 there); the layout marks the padding (positions 0..T-1, as transformers
// with an attention_mask).
SftBatch pad_batch(const std::vector<data::SftExample>& examples, int32_t pad_id);

// The examples in order, each appended to the current row while it fits in
// seq_len tokens, else starting the next row; rows end in padding. Positions
// restart per example and no example attends to another; an example's first
// token is no target (the previous example's last token would predict it), as
// TRL's padding-free collator. Throws ConfigError for an example longer than
// seq_len (truncate to data.max_length <= seq_len first).
SftBatch pack_batch(const std::vector<data::SftExample>& examples, int64_t seq_len, int32_t pad_id);

// The batches' rows one under another (a step's micro-batches as one pipeline
// batch), each padded on the right to the longest: pad_id, labels -100,
// padding documents (seen by no other token). Every real token keeps its
// position, document and label, so each batch's rows compute as they did.
SftBatch concat_batches(const std::vector<SftBatch>& batches, int32_t pad_id);

}  // namespace colossus::apps
