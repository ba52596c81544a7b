// What a training run tells the person watching it: a progress bar on rank 0
// (step, loss, lr, tokens/s, MFU on GPUs, memory, ETA), metrics.jsonl and
// TensorBoard event files in the output directory, and loss.svg (train and
// eval loss against step) at the end. Every rank may construct one; only rank
// 0 writes or prints.
#pragma once
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/trainer.h"

#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace colossus::apps {

class RunReporter {
 public:
  // start_step > 0 when resuming: records after it are dropped from metrics.jsonl.
  RunReporter(const TrainConfig& config, int rank, int64_t start_step, c10::Device device);
  ~RunReporter();

  // mfu: NaN off the GPU.
  void on_step(const StepRecord& record, int64_t tokens_seen, double mfu);
  void on_eval(int64_t step, double eval_loss);
  void on_checkpoint(int64_t step, const std::string& dir);
  // Closes the bar and writes loss.svg.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace colossus::apps
