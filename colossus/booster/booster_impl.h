// Internal to the Booster: its private state, shared by booster.cpp (boosting,
// training-step helpers) and booster_checkpoint.cpp (collective save/load).
#pragma once
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
};

// Collective error agreement over `group` (a 1-element all-reduce, which also
// acts as the barrier that ends a save): if this rank failed, rethrows its
// exception; if another rank failed, throws CheckpointError naming `what` and
// that rank. Every rank must call it, failed or not.
void agree_on_success(cluster::ProcessGroup& group, std::exception_ptr local_error, const std::string& what);

// Runs `write` on rank 0 of `group` only, then agrees with the other ranks.
template <class Fn>
void write_on_rank0(cluster::ProcessGroup& group, const std::string& what, Fn&& write) {
  std::exception_ptr error;
  if (group.rank() == 0) {
    try {
      write();
    } catch (...) {
      error = std::current_exception();
    }
  }
  agree_on_success(group, error, what);
}

// Runs `read` on every rank, then agrees (one failed rank fails them all).
template <class Fn>
void read_on_all(cluster::ProcessGroup& group, const std::string& what, Fn&& read) {
  std::exception_ptr error;
  try {
    read();
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_success(group, error, what);
}

// The optimizer files every plugin's IO writes (optimizer.safetensors or
// shards + index, the state JSON in each file's metadata under this key), so
// DDP, ZeRO and tensor-parallel checkpoints load into one another.
inline constexpr const char* kOptimizerPrefix = "optimizer";
inline constexpr const char* kOptimizerStateKey = "colossus.optimizer_state";

// The optimizer state in `dir` (optimizer.safetensors or shards + index; the
// JSON from the metadata), tensors as zero-copy mapped views, so a loader that
// keeps only its parts reads only those pages. Throws CheckpointError naming
// the missing or malformed file.
optim::OptimizerState read_optimizer_state(const std::string& dir);
// config.json of a Hugging Face model directory with torch_dtype = `dtype`,
// written atomically (the directory is created if needed).
void write_model_config(models::ModelConfig config, c10::ScalarType dtype, const std::string& dir);
// read_optimizer_state + optimizer.load_state_dict, errors naming `dir`.
void load_optimizer_state(optim::Optimizer& optimizer, const std::string& dir);

}  // namespace colossus::booster
