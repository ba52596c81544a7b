// The optimizer-state format shared by LowLevelZeroOptimizer and
// GeminiOptimizer. Both keep each dp rank's part of every parameter's state in
// a flat bucket/chunk (zero::Layout); on disk the state is per whole parameter
// in the format the Booster writes for DDP ("state.<i>.<slot>" by the inner
// optimizer's flat index i, plus "master.<i>" and MixedPrecisionOptimizer's
// JSON for bf16/fp16), so it moves between dp sizes, ZeRO stages, Gemini and
// DDP. Saving all-gathers one bucket at a time and keeps the parameters a
// predicate selects (all of them for a gathered save, this rank's writer share
// for a per-rank sharded save); loading cuts this rank's parts out of whole
// tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "colossus/cluster/process_group.h"
#include "colossus/optim/optimizer.h"
#include "colossus/zero/low_level/bucket_store.h"

namespace colossus::zero {

// What the format needs to know about a sharded optimizer.
struct ShardedStateLayout {
  std::string name;  // the optimizer's, for error messages
  const NamedParams* params = nullptr;
  const Layout* layout = nullptr;                // slots by parameter index; buckets give shard sizes
  const std::vector<size_t>* inner_order = nullptr;  // inner flat index -> parameter index
  std::function<at::Tensor(size_t)> master_view;     // parameter index -> this rank's master part
  cluster::ProcessGroup* group = nullptr;            // the dp group the buckets are sharded over
  c10::Device device = c10::kCPU;                    // where the all-gathers run
};

// The dp rank that writes parameter k's whole tensors in a per-rank sharded
// save: the owner of its first element (so the shares follow the buckets and
// are balanced as they are). Unmanaged (frozen) parameters go to rank 0.
int writer_rank(const Layout& layout, size_t param_index, int dp_size);

// Collective over the dp group: the whole-parameter state tensors of every
// parameter `keep` accepts (every rank must pass the same bucket sequence;
// `keep` may differ per rank). With `with_masters`, "master.<i>" too.
// Tensors are fresh CPU copies.
std::vector<std::pair<std::string, at::Tensor>> gather_state_tensors(const ShardedStateLayout& layout, const optim::OptimizerState& local,
                                          bool with_masters, const std::function<bool(size_t)>& keep);

// MixedPrecisionOptimizer's JSON around the inner optimizer's.
std::string mixed_precision_json(const std::string& inner_name, const std::string& inner_json,
                                 const std::optional<std::string>& loss_scaler_json, int64_t skipped_steps);

// An unsharded state split for this rank.
struct RankState {
  optim::OptimizerState inner;                          // this rank's parts, for the inner optimizer
  std::vector<std::pair<size_t, at::Tensor>> masters;  // (parameter index, whole tensor)
  std::optional<std::string> loss_scaler_json;         // saved with fp16 loss scaling
  int64_t skipped_steps = 0;
};

// Validates `state` (names, indices, shapes, mixed precision against
// `has_scaler` / `precision`) and cuts out this rank's parts, on the device
// of each master view. Throws CheckpointError naming the bad tensor.
RankState split_state(const ShardedStateLayout& layout, const optim::OptimizerState& state, bool has_scaler,
                      const std::string& precision);

}  // namespace colossus::zero
