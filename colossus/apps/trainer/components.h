// Building the model, optimizer and LR schedule a TrainConfig names, each
// from the option struct of its own layer.
#pragma once
#include "colossus/apps/trainer/train_config.h"
#include "colossus/data/tokenizer.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"
#include "colossus/optim/lr_scheduler.h"
#include "colossus/optim/optimizer.h"

#include <memory>

namespace colossus::apps {

// The preset (or pretrained config.json) with model.config keys applied. A
// preset's vocabulary grows to the tokenizer's (rounded up to a multiple of
// 64) unless model.config sets vocab_size, and takes the tokenizer's
// bos/eos/pad ids; a pretrained model's vocabulary must already cover it. data.seq_len must fit the model's positions.
models::ModelConfig build_model_config(const TrainConfig& config, const data::Tokenizer& tokenizer);

// Two groups when decay_1d_params is false: weights with decay, 1-D
// parameters (biases, norm weights) without.
std::unique_ptr<optim::Optimizer> build_optimizer(const OptimizerSection& options, models::CausalLM& model);

std::shared_ptr<optim::LRScheduler> build_lr_scheduler(const SchedulerSection& options, optim::Optimizer& optimizer,
                                                       int64_t train_steps);

// Training FLOPs per token, 6N + 6·L·d·T (weights forward+backward, plus
// causal attention), as the MFU figures we compare with count them.
double flops_per_token(const models::CausalLM& model, int64_t seq_len);

}  // namespace colossus::apps
