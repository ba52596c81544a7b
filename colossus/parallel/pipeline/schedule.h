// Pipeline schedules as data: the ordered list of actions one pp rank runs in
// a step. F runs a microbatch through a chunk; B is its full backward (input
// and weight gradients) or, in the zero-bubble schedule, only the input
// gradient, with W computing the weight gradients later (to fill bubbles).
// The runtime (runtime.h) executes a list with the p2p it implies, so a custom
// order (Colossal-AI's scheduler_nodes) is just another list.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossus::parallel::pipeline {

enum class ActionKind { Forward, Backward, BackwardInput, BackwardWeight };

struct Action {
  ActionKind kind = ActionKind::Forward;
  int64_t microbatch = 0;
  int chunk = 0;
  bool operator==(const Action&) const = default;
};

// "F3", "B3.c1", "W0": for traces and errors.
std::string to_string(const Action& action);

enum class ScheduleKind { OneFOneB, Interleaved, ZeroBubble };

// Throws ConfigError when the kind cannot run M microbatches on pp ranks with
// C chunks: interleaved needs C >= 2 and M a multiple of pp (Megatron's
// order); 1f1b and zero_bubble need C = 1.
void validate_schedule(ScheduleKind kind, int pp_size, int num_model_chunks, int64_t num_microbatches);

// 1F1B: min(pp - 1 - rank, M) warm-up forwards, then one forward and one
// backward alternately, then the remaining backwards.
std::vector<Action> one_f_one_b(int pp_size, int pp_rank, int64_t num_microbatches);

// Megatron's interleaved order over C chunks (virtual stage = chunk * pp +
// rank): forwards walk microbatches in groups of pp, chunk by chunk; warm-up is
// (pp - rank - 1) * 2 + (C - 1) * pp forwards (all of them when M == pp).
std::vector<Action> interleaved(int pp_size, int pp_rank, int64_t num_microbatches, int num_model_chunks);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): each backward split
// into B (input gradient, on the critical path) and W (weight gradient);
// pp - rank warm-up forwards, then B(i), W(i - rank), F per microbatch, so
// the W passes fill the cool-down bubbles. Peak in-flight microbatches: pp
// (1F1B's first stage). With equal F/B/W costs and M >= pp its bubble is a
// third of 1F1B's (checked by simulate() in the tests).
std::vector<Action> zero_bubble_h1(int pp_size, int pp_rank, int64_t num_microbatches);

std::vector<Action> make_schedule(ScheduleKind kind, int pp_size, int pp_rank, int64_t num_microbatches,
                                  int num_model_chunks);

// Evaluation: forwards only, chunk by chunk, each chunk's microbatches in
// order (virtual stage v's F(m) needs only v - 1's F(m), so with sends
// that do not block no rank waits on a later action). Any pp_size, any M >= 1.
std::vector<Action> forward_only(int num_model_chunks, int64_t num_microbatches);

// One action as it ran: wall-clock microseconds (or simulated time units).
struct TimedAction {
  Action action;
  double start_us = 0.0;  // after its input arrived
  double end_us = 0.0;
};

// Runs every pp rank's list (per_rank[r]) on an ideal machine: an action
// starts when its rank is free and its input is ready (free, instant p2p);
// costs per stage: forward f, input-backward b, weight-backward w (a full
// backward costs b + w). Returns each rank's timeline; throws ConfigError
// naming the stuck actions if the lists deadlock or miss a dependency.
std::vector<std::vector<TimedAction>> simulate(const std::vector<std::vector<Action>>& per_rank, int num_model_chunks,
                                               double f = 1.0, double b = 1.0, double w = 1.0);

// Measured bubble fraction: 1 - busy / (makespan x ranks), over all ranks'
// timelines (makespan from the earliest start to the latest end).
double bubble_fraction(const std::vector<std::vector<TimedAction>>& timelines);

// Analytic bubble fraction (idle / total time per rank) with equal per-stage
// costs, forward : input-backward : weight-backward = 1 : 1 : 1:
// 1f1b (pp-1)/(M+pp-1); interleaved (pp-1)/(C*M+pp-1); zero_bubble (ZB-H1)
// (pp-1)/(3M+pp-1) for M >= pp, a third of 1F1B's bubble.
double analytic_bubble_fraction(ScheduleKind kind, int pp_size, int64_t num_microbatches, int num_model_chunks);

}  // namespace colossus::parallel::pipeline
