// What Booster::execute_pipeline takes and returns (Colossal-AI's
// execute_pipeline(data_iter, model, criterion, optimizer, return_loss,
// return_outputs)): a batch per call from the data iterator, an optional
// criterion in place of the model's loss, and the step's loss / logits.
#pragma once
#include "colossus/models/token_layout.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace colossus::booster {

struct PipelineBatch {
  at::Tensor input_ids;  // (B, T) int64: this data-parallel rank's rows
  at::Tensor labels;     // (B, T) int64, -100 ignored; undefined: input_ids (causal LM)
  // Padded or packed rows (positions, documents), split with the rows into
  // microbatches; empty: plain causal rows.
  models::TokenLayout layout;
  // Further per-row values (B, ...), split with the rows and handed to the
  // criterion (as Colossal-AI's criterion gets the micro-batch's inputs):
  // e.g. DPO's reference log-probs.
  std::vector<at::Tensor> row_tensors;
};

// Yields the next batch (called once per execute_pipeline).
using PipelineDataIter = std::function<PipelineBatch()>;

// logits of one microbatch (as the model's forward returns them: this rank's
// vocab slice under tp), the microbatch's rows of the batch (input_ids,
// labels (B_mb, T) always defined, layout, row_tensors), and the label count
// of the whole batch -> that microbatch's share of the batch loss (the shares
// sum to the batch loss). Empty: the model's loss with num_items (HF semantics).
using PipelineCriterion =
    std::function<at::Tensor(const at::Tensor& logits, const PipelineBatch& microbatch, int64_t num_items)>;

struct PipelineOutput {
  at::Tensor loss;     // scalar, the batch loss (every pp rank gets it); undefined
                       // unless return_loss
  at::Tensor outputs;  // (B, T, V_local) logits on the last stage's ranks,
                       // undefined elsewhere / unless asked
};

}  // namespace colossus::booster
