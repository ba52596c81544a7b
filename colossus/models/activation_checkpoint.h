// Activation checkpointing (Colossal-AI's gradient_checkpoint_config): a
// block wrapper whose forward keeps only its input, and whose backward reruns
// the block with autograd on and backpropagates through the rerun. Activation
// memory of a wrapped block falls from all its intermediates to one (B, T, C)
// input, for one extra forward per block in backward.
#pragma once
#include "colossus/models/causal_lm.h"

#include <cstdint>
#include <memory>

namespace colossus::models {

class CheckpointedBlock : public TransformerBlock {
 public:
  // Adopts `inner`'s children, so parameter names stay HF's.
  explicit CheckpointedBlock(std::shared_ptr<TransformerBlock> inner);
  // hidden: (B, T, C) -> (B, T, C). Without grad mode (or with an attention
  // hook, i.e. inference) it is the inner block's plain forward. The CPU RNG
  // state is replayed in the rerun, so dropout draws the same mask.
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override;
  TransformerBlock& inner() const { return *inner_; }

 private:
  std::shared_ptr<TransformerBlock> inner_;
};

// Wraps the first round(ratio x blocks) blocks of `model` (Colossal-AI's
// gradient_checkpointing_ratio: 1.0 = all, 0.5 = half of them); returns how
// many were wrapped. Throws ConfigError unless 0 <= ratio <= 1.
int64_t enable_activation_checkpointing(CausalLM& model, double ratio = 1.0);

}  // namespace colossus::models
