// Executes a schedule (schedule.h) on one pp rank: each action receives what
// it needs from the neighbouring virtual stage, computes, and starts sending
// its result. Forward outputs stay alive (autograd graph) until their
// backward; a split backward (zero-bubble) keeps the graph from B to W.
// With overlap_p2p the receive of the next action is posted before the
// current one computes, so the transfer overlaps with compute.
#pragma once
#include "colossus/parallel/pipeline/p2p.h"
#include "colossus/parallel/pipeline/schedule.h"
#include "colossus/parallel/pipeline/stage_manager.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace colossus::parallel::pipeline {

// What the model side supplies. All tensors of a step share one shape per
// channel, so p2p shapes are exchanged once.
struct StageFunctions {
  // chunk c of this rank, microbatch m, input (B_mb, T, C) from the previous
  // virtual stage (undefined on the first) -> the hidden state for the next
  // virtual stage, or on the last one the microbatch's scalar loss.
  std::function<at::Tensor(int chunk, int64_t microbatch, const at::Tensor& input)> forward;
  // The parameters whose gradients chunk c's W pass computes (zero-bubble
  // only).
  std::function<std::vector<at::Tensor>(int chunk)> parameters;
  // Applied to a loss before its backward (fp16 loss scaling); may be empty.
  std::function<at::Tensor(const at::Tensor& loss)> scale_loss;
};

struct RunResult {
  std::vector<at::Tensor> losses;  // per microbatch, detached; on the rank
                                   // holding the last virtual stage
  std::vector<TimedAction> timeline;
};

class PipelineRuntime {
 public:
  PipelineRuntime(const StageManager& stages, cluster::ProcessGroupPtr pp_group, bool overlap_p2p);

  // Runs `actions` for `num_microbatches` microbatches whose activations live
  // on `device`. `shape_key` identifies the microbatch shape: when it differs
  // from the previous run's, cached p2p shapes are dropped. forward_only
  // (evaluation, under a NoGradGuard): Forward actions only, nothing kept
  // for a backward, losses returned as usual.
  RunResult run(const std::vector<Action>& actions, const StageFunctions& functions, int64_t num_microbatches,
                const std::vector<int64_t>& shape_key, c10::Device device, bool forward_only = false);

 private:
  const StageManager& stages_;
  PipelineP2P p2p_;
  bool overlap_p2p_;
  std::vector<int64_t> last_shape_key_;
};

// Chrome trace JSON (chrome://tracing, Perfetto) of every rank's timeline:
// one row per pp rank, one slice per action. `timelines[r]` is pp rank r's.
std::string chrome_trace_json(const std::vector<std::vector<TimedAction>>& timelines);

// Every pp rank's timeline (its RunResult::timeline), on every pp rank:
// collective over `pp_group`. Times are each rank's wall clock, so ranks of
// one host share a time base (across hosts, clock skew shifts whole rows).
std::vector<std::vector<TimedAction>> gather_timelines(cluster::ProcessGroup& pp_group,
                                                       const std::vector<TimedAction>& local);

}  // namespace colossus::parallel::pipeline
