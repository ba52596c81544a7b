// Internal to the Booster: its private state, shared by booster.cpp (boosting,
// training-step helpers) and booster_checkpoint.cpp (collective save/load).
#pragma once
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster.h"
#include "colossus/checkpoint/async_writer.h"
#include "colossus/cluster/logger.h"

#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace colossus::booster {

struct Booster::Impl {
  cluster::Logger log{"booster"};
  // One writer per kind, so an async model save and the optimizer save right
  // after it are both in flight while training goes on.
  checkpoint::AsyncWriter model_writer;
  checkpoint::AsyncWriter optimizer_writer;
  // Models boosted with fp32 masters, and their optimizer: load_model must
  // move the masters too, or the next step would write the old weights back.
  struct MixedModel {
    const ModelWrapper* model;
    std::weak_ptr<amp::MixedPrecisionOptimizer> optimizer;
  };
  std::vector<MixedModel> mixed_models;
};

// Collective error agreement over `group` (a 1-element all-reduce, which also
// acts as the barrier that ends a save): if this rank failed, rethrows its
// exception; if another rank failed, throws CheckpointError naming `what` and
// that rank. Every rank must call it, failed or not.
void agree_on_success(cluster::ProcessGroup& group, std::exception_ptr local_error, const std::string& what);

// fp32 masters follow the model's bf16/fp16 parameters where they no longer
// round to them (weights loaded or broadcast into the model after the masters
// were made). Returns how many masters changed.
int64_t refresh_masters(amp::MixedPrecisionOptimizer& optimizer);

}  // namespace colossus::booster
