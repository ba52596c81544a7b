// Activation checkpointing (Colossal-AI's gradient_checkpoint_config): a
// block wrapper whose forward keeps only its input, and whose backward reruns
// the block with autograd on and backpropagates through the rerun. Activation
// memory of a wrapped block falls from all its intermediates to one (B, T, C)
// input, for one extra forward per block in backward.
#pragma once
#include "colossus/models/causal_lm.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

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

// Queues `callback` to run when the outermost backward finishes, as
// Engine::queue_callback does for the backward it is called from. A
// checkpointed block's backward runs a nested backward over its rerun, and a
// callback queued from a gradient hook inside it would run when that nested
// backward ends, before the blocks below have their gradients (a reducer
// whose first gradient lands inside the rerun, such as the experts' under
// moe_hybrid_parallel, then reduced too early). Inside a rerun the callback
// waits until the rerun's backward returns and is queued then, on the
// enclosing backward. Must be called while a backward runs.
void queue_outer_backward_callback(std::function<void()> callback);

// True while a checkpointed block reruns its forward inside backward (on
// this thread): layers with per-call state (FP8 delayed scaling) refuse it.
bool in_checkpoint_rerun();

// Runs fn(input) keeping only `input`: backward reruns fn with the forward's
// CPU and device RNG states (dropout draws the same masks) and backpropagates
// through the rerun, so parameters used in fn get their gradients there. fn
// must stay alive until that backward. Without grad mode, or for an input
// that needs no gradient, it is fn(input).
at::Tensor checkpoint_call(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input);

// What a checkpointed block reruns in backward (gradient_checkpointing_granularity).
//   Full: the whole block; only its (B, T, C) input is kept.
//   Mlp: only the block's MLP; the MLP's input (the second norm's output) is
//        kept and everything before it is stored as without checkpointing.
//        A LLaMA MLP's gate, up and activation outputs (3 x ffn wide) are
//        most of a block's activations, and its rerun costs the MLP's three
//        matmuls instead of the whole block with attention. Dense blocks only
//        (the LLaMA family and GPT-2), not mixture-of-experts blocks.
enum class CheckpointGranularity { Full, Mlp };
// "full" or "mlp"; ConfigError naming the value otherwise.
CheckpointGranularity parse_checkpoint_granularity(const std::string& name);
const char* checkpoint_granularity_name(CheckpointGranularity granularity);

// Checkpoints the first round(ratio x blocks) blocks of `model` (Colossal-AI's
// gradient_checkpointing_ratio: 1.0 = all, 0.5 = half of them) at the given
// granularity; returns how many. Throws ConfigError unless 0 <= ratio <= 1,
// or when a block cannot take the granularity (naming it).
int64_t enable_activation_checkpointing(CausalLM& model, double ratio = 1.0,
                                        CheckpointGranularity granularity = CheckpointGranularity::Full);

}  // namespace colossus::models
