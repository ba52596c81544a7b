// Where each chunk lives: its parameter shard (device or pinned host memory),
// its optimizer side (fp32 master shard, gradient shard, optimizer state), and
// whether it stays gathered (not sharded: shard_param_frac < 1). Decisions are
// plain functions of chunk counts and byte figures so they are testable on
// CPU ranks, where "device" and "host" are the same memory.
#pragma once
#include <cstdint>
#include <vector>

namespace colossus::zero::gemini {

struct ChunkPlacement {
  bool param_on_host = false;  // parameter shard offloaded (gathered onto the device for use)
  bool optim_on_host = false;  // master, gradient shard and optimizer state
                               // offloaded (CPU Adam steps them)
  bool keep_gathered = false;  // whole chunk resident on every rank (ZeRO-2 style for this chunk)
  bool operator==(const ChunkPlacement&) const = default;
};

// Colossal-AI's static policy over `chunks` equal chunks: the last
// (1 - shard_param_frac) of them stay gathered; of the rest, the first
// ceil(offload_optim_frac * n) have their optimizer side on the host and the
// first ceil(offload_param_frac * n) their parameter shard.
std::vector<ChunkPlacement> static_placement(size_t chunks, double shard_param_frac, double offload_optim_frac,
                                             double offload_param_frac);

// The auto policy's safety margin over the traced non-model peak: the
// warm-up measures one step's peak, but the steps after it add what the trace
// cannot see (the device optimizer's temporaries, batches of another length,
// allocator rounding). 10% of the peak, inside the steady cap (which leaves
// 1 - steady_cuda_cap_ratio of the device unused besides).
inline constexpr double kNonModelHeadroom = 0.10;

struct AutoPlacementInput {
  int64_t device_budget_bytes = 0;    // what chunks and non-model data may use on the device
                                      // (steady_cuda_cap_ratio x capacity)
  int64_t non_model_peak_bytes = 0;   // the traced peak of non-model data (activations, temporaries);
                                      // taken with kNonModelHeadroom on top
  int64_t param_shard_bytes = 0;      // one chunk's parameter shard
  int64_t optim_shard_bytes = 0;      // one chunk's master + gradient shard + optimizer state (estimate)
  int64_t working_bytes = 0;          // gathered chunks in use at once (device memory the schedule needs)
  double gpu_margin_mem_ratio = 1.0;  // share of what is left after the parameters for optimizer shards
  int64_t host_budget_bytes = 0;      // what optimizer sides may use on the host; 0: no limit
  int64_t host_optim_shard_bytes = 0;  // one chunk's optimizer side on the host
};

// The auto policy: parameter shards stay on the device in chunk order while
// they fit the budget (after the non-model peak with its headroom and the
// working set), the rest go to the host; the optimizer side goes to the
// device, again in order, into gpu_margin_mem_ratio of the margin left after
// the parameters (all of it by default: the margin is measured). Where the
// host cannot hold the rest (host_budget_bytes), more optimizer sides go to
// the device, in order, into the whole margin, until the rest fits the host
// or the margin is full: a ratio's slack gives way before the host runs
// out, so a model that fits the two memories together trains with any ratio.
std::vector<ChunkPlacement> auto_placement(size_t chunks, const AutoPlacementInput& input);

}  // namespace colossus::zero::gemini
