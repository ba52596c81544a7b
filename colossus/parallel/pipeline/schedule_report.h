// An analytic bubble / activation-memory report per pipeline schedule, so a
// user can pick pp_style and num_microbatches before a run (`colossus plan`
// prints it). Bubbles come from running every rank's action list on the ideal
// machine (simulate(), forward : input-backward : weight-backward = 1 : 1 : 1),
// memory from the most (microbatch, chunk) activations any rank holds.
#pragma once
#include "colossus/parallel/pipeline/schedule.h"

#include <cstdint>
#include <string>
#include <vector>

namespace colossus::parallel::pipeline {

struct ScheduleReportOptions {
  int pp_size = 2;
  int64_t num_microbatches = 8;
  int num_model_chunks = 2;  // for the interleaved row (1f1b / zero_bubble use 1)
  // Optional model shape for bytes: 0 leaves the memory columns in
  // microbatches only.
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t seq_len = 0;
  int64_t microbatch_size = 1;
  int64_t activation_bytes = 2;  // per element: 2 for bf16/fp16, 4 for fp32

  // Throws ConfigError naming the bad value and a valid alternative.
  void validate() const;
};

struct ScheduleReport {
  std::string name;  // pp_style: "1f1b", "interleaved", "zero_bubble"
  int num_model_chunks = 1;
  bool runnable = true;
  std::string why_not;  // the ConfigError text when not runnable
  double bubble = 0.0;  // idle / total time per rank on the ideal machine
  // Most activations any rank holds at once, in whole-stage microbatches
  // (an interleaved chunk holds 1/C of a stage's layers).
  double peak_in_flight = 0.0;
  int64_t activation_bytes = 0;  // peak_in_flight x one microbatch's stage activations; 0 without a model shape
};

struct PipelinePlanReport {
  std::vector<ScheduleReport> schedules;
  std::string recommended;  // a pp_style name
  std::vector<std::string> notes;
};

// One microbatch's activations through one layer, in bytes: Korthikanti et
// al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
// s*b*h*34 at 2 bytes per element with fused (flash/SDPA) attention, scaled
// by activation_bytes / 2. A GPT-style block; an estimate, not a measurement.
int64_t layer_activation_bytes(int64_t seq_len, int64_t microbatch_size, int64_t hidden_size,
                               int64_t activation_bytes);

// Most (microbatch, chunk) pairs whose forward ran and whose (weight)
// backward has not, over one rank's list.
int64_t peak_in_flight(const std::vector<Action>& actions);

PipelinePlanReport plan_pipeline(const ScheduleReportOptions& options);

// The report as a table with one row per schedule, the recommendation and notes.
std::string format_plan(const ScheduleReportOptions& options, const PipelinePlanReport& report);

}  // namespace colossus::parallel::pipeline
