// `colossus train` as a library call: builds everything a TrainConfig names
// (cluster, tokenizer and data, model, optimizer, LR schedule, plugin and
// Booster), runs the loop with gradient accumulation, logs, evaluates,
// checkpoints, and resumes exactly from a checkpoint.
//
// One optimizer step:
//   grad_accum x [ micro-batch (batch_size, seq_len) from this rank's loader
//                  -> forward -> loss / grad_accum -> backward (no_sync on all
//                  but the last micro-batch, so DDP all-reduces once per step) ]
//   -> optimizer step (fp32 masters under bf16/fp16) -> LR schedule step -> zero grads.
// The logged loss is the mean over the step's micro-batches and all dp ranks.
#pragma once
#include "colossus/apps/trainer/train_config.h"
#include "colossus/core/errors.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace colossus::apps {

// The run stopped because its loss or gradients stayed non-finite for
// train.max_nonfinite_steps steps in a row (see docs/reliability.md).
struct DivergenceError : Error {
  using Error::Error;
};

struct TrainOptions {
  // "" starts fresh; "auto" continues from OUTPUT_DIR's latest checkpoint if
  // there is one; else a step directory or a run directory.
  std::string resume;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;  // mean over the steps since the previous record
  double lr = 0.0;
  double tokens_per_s = 0.0;
  std::map<std::string, double> metrics;  // task metrics (dpo: rewards/chosen, ...), means over the same steps
  // Run metrics (NaN where not measured):
  double grad_norm = std::numeric_limits<double>::quiet_NaN();   // the last step's, before clipping (clipping on)
  double loss_scale = std::numeric_limits<double>::quiet_NaN();  // fp16's, for the next step
  double step_time_s = 0.0;                                      // mean wall time of a step since the previous record
  double data_wait_s = 0.0;                                      // of which waiting for the step's batches
  double peak_device_mib = std::numeric_limits<double>::quiet_NaN();  // allocated on this rank's device, since start
  double peak_host_mib = std::numeric_limits<double>::quiet_NaN();    // this process's resident set, since start
};

struct TrainResult {
  std::vector<StepRecord> steps;                        // the logged steps of this process's run
  std::vector<std::pair<int64_t, double>> eval_losses;  // (step, eval loss)
  int64_t first_step = 0;                               // 0, or the step resumed from
  int64_t final_step = 0;
  std::string final_checkpoint;  // empty if none was written
  bool interrupted = false;      // stopped early by SIGINT/SIGTERM (a checkpoint was saved)
  // fp8_communication: bytes this rank's fp8 collectives sent in the run's
  // first step, and what the same collectives in the tensors' own dtype would
  // have sent (both 0 without it; cluster/fp8_collectives.h).
  int64_t fp8_wire_bytes_per_step = 0;
  int64_t plain_wire_bytes_per_step = 0;
};

// Collective: every rank of the job calls it with the same config.
TrainResult train(const TrainConfig& config, const TrainOptions& options = {});

}  // namespace colossus::apps
