#include "colossus/apps/trainer/run_reporter.h"

#include "colossus/metrics/jsonl_writer.h"
#include "colossus/metrics/progress_bar.h"
#include "colossus/metrics/metrics_plot.h"
#include "colossus/metrics/tensorboard_writer.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <optional>

namespace colossus::apps {

namespace fs = std::filesystem;

struct RunReporter::Impl {
  fs::path output_dir;
  std::optional<metrics::MetricsWriter> jsonl;
  std::optional<metrics::TensorBoardWriter> tensorboard;
  std::optional<metrics::ProgressBar> bar;
  bool finished = false;
};

RunReporter::RunReporter(const TrainConfig& config, int rank, int64_t start_step, c10::Device device)
    : impl_(std::make_unique<Impl>()) {
  (void)device;
  if (rank != 0) return;
  impl_->output_dir = config.train.output_dir;
  impl_->jsonl.emplace(impl_->output_dir / "metrics.jsonl");
  // A fresh run in an old directory, or a resumed one: records past the start are stale.
  impl_->jsonl->truncate_after(start_step);
  if (config.train.tensorboard) {
    metrics::TensorBoardOptions tb;
    if (start_step > 0) tb.resume_step = start_step;
    impl_->tensorboard.emplace(impl_->output_dir / "tensorboard", tb);
  }
  impl_->bar.emplace(config.train.steps, "train",
                     metrics::ProgressBarOptions{.enabled = true, .print_every = 1, .initial_step = start_step});
}

RunReporter::~RunReporter() {
  try {
    finish();
  } catch (...) {
    // Reporting must never turn a finished run into a failed one.
  }
}

void RunReporter::on_step(const StepRecord& r, int64_t tokens_seen, double mfu) {
  if (!impl_->jsonl) return;
  metrics::MetricFields fields{{"loss", r.loss},
                               {"lr", r.lr},
                               {"tokens_per_s", r.tokens_per_s},
                               {"tokens", static_cast<double>(tokens_seen)}};
  if (!std::isnan(mfu)) fields.emplace_back("mfu", mfu);
  // Run metrics, where measured (a NaN is left out, not written).
  const std::pair<const char*, double> run[] = {{"grad_norm", r.grad_norm},
                                                {"loss_scale", r.loss_scale},
                                                {"step_time_s", r.step_time_s},
                                                {"data_wait_s", r.data_wait_s},
                                                {"peak_device_mib", r.peak_device_mib},
                                                {"peak_host_mib", r.peak_host_mib}};
  for (const auto& [name, value] : run) {
    if (!std::isnan(value)) fields.emplace_back(name, value);
  }
  for (const auto& [name, value] : r.metrics) fields.emplace_back(name, value);
  impl_->jsonl->write(r.step, fields);
  if (impl_->tensorboard) {
    std::vector<std::pair<std::string, double>> scalars;
    // Every field, tokens seen too (TensorBoard keeps float32: exact to 2^24
    // tokens, then to 7 digits; metrics.jsonl has the exact count).
    for (const auto& [name, value] : fields) scalars.emplace_back("train/" + name, value);
    impl_->tensorboard->add_scalars(r.step, scalars);
  }
  metrics::ProgressFields shown{{"loss", r.loss}, {"lr", r.lr}, {"tokens_per_s", r.tokens_per_s}};
  if (!std::isnan(mfu)) shown.emplace_back("mfu", mfu);
  impl_->bar->update(r.step, shown);
}

void RunReporter::on_eval(int64_t step, double eval_loss) {
  if (!impl_->jsonl) return;
  impl_->jsonl->write(step, {{"eval_loss", eval_loss}});
  if (impl_->tensorboard) impl_->tensorboard->add_scalar("eval/loss", eval_loss, step);
  impl_->bar->note(fmt::format("step {}: eval loss {:.4f}", step, eval_loss));
}

void RunReporter::on_checkpoint(int64_t step, const std::string& dir) {
  if (!impl_->bar) return;
  impl_->bar->note(fmt::format("step {}: checkpoint saved to {}", step, dir));
}

void RunReporter::finish() {
  if (!impl_->jsonl || impl_->finished) return;
  impl_->finished = true;
  impl_->bar->finish();
  const auto svg = impl_->output_dir / "loss.svg";
  metrics::write_metrics_plot_svg(impl_->jsonl->path(), svg, {"loss", "eval_loss"},
                                  {.title = "Loss", .y_label = "cross-entropy (nats/token)"});
  impl_->bar->note(fmt::format("metrics: {}, plot: {}", impl_->jsonl->path().string(), svg.string()));
}

}  // namespace colossus::apps
