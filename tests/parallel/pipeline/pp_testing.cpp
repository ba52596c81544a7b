#include "tests/parallel/pipeline/pp_testing.h"

#include "colossus/models/lazy_init.h"

#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/lr_scheduler.h"
#include "tests/booster/booster_testing.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

namespace colossus::booster::testing {

namespace ct = colossus::testing;

models::ModelConfig deep(models::ModelConfig config) {
  if (auto* gpt2 = std::get_if<models::GPT2Config>(&config)) gpt2->n_layer = 8;
  if (auto* llama = std::get_if<models::LlamaConfig>(&config)) llama->num_hidden_layers = 8;
  return config;
}

const std::vector<double>& reference(const models::ModelConfig& config, double max_norm) {
  static std::map<std::pair<std::string, double>, std::vector<double>> cache;
  const auto key = std::make_pair(models::model_type(config), max_norm);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, reference_losses(config, kSteps, max_norm)).first;
  return it->second;
}

std::shared_ptr<models::CausalLM> trained_single_process(const models::ModelConfig& config, int64_t steps) {
  auto model = models::create_model(config, {.seed = 7});
  optim::AdamW optimizer(model->parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
  optim::CosineWarmupLR scheduler(optimizer, optim::CosineLROptions{.warmup_steps = 4, .total_steps = kSteps});
  for (int64_t step = 0; step < steps; ++step) {
    auto ids = global_batch(config, step);
    model->loss(model->forward(ids), ids).backward();
    optimizer.step();
    scheduler.step();
    optimizer.zero_grad();
  }
  return model;
}

double loss_on(models::CausalLM& model, const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  return model.loss(model.forward(ids), ids).item<double>();
}

PpRun::PpRun(const models::ModelConfig& config, HybridParallelPluginOptions options, bool lazy) : config_(config) {
  plugin_ = std::make_shared<HybridParallelPlugin>(std::move(options), ct::world());
  booster_ = std::make_unique<Booster>(plugin_);
  auto model = lazy ? models::create_lazy_model(config) : models::create_model(config, {.seed = 7});
  auto optimizer =
      std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
  auto scheduler = std::make_shared<optim::CosineWarmupLR>(
      *optimizer, optim::CosineLROptions{.warmup_steps = 4, .total_steps = kSteps});
  boosted_ = booster_->boost(model, std::move(optimizer), scheduler, /*dataloader=*/nullptr,
                             lazy ? models::seeded_source(model, 7) : models::ParamSource());
}

at::Tensor PpRun::rows(const at::Tensor& batch) const {
  auto dp = plugin_->dp_group();
  const int64_t n = batch.size(0) / dp->size();
  return batch.narrow(0, dp->rank() * n, n);
}

double PpRun::mean_over_dp(double loss) const {
  auto dp = plugin_->dp_group();
  auto total = at::full({1}, loss, at::kDouble);
  dp->all_reduce(total).wait();
  return total.item<double>() / dp->size();
}

double PpRun::train_step(int64_t step) {
  auto ids = rows(global_batch(config_, step));
  auto out = booster_->execute_pipeline([&] { return PipelineBatch{.input_ids = ids}; }, *boosted_.model, {},
                                        *boosted_.optimizer);
  boosted_.optimizer->step();
  boosted_.lr_scheduler->step();
  boosted_.optimizer->zero_grad();
  return mean_over_dp(out.loss.item<double>());
}

std::vector<double> PpRun::train(int64_t first, int64_t end) {
  std::vector<double> losses;
  for (int64_t step = first; step < end; ++step) losses.push_back(train_step(step));
  return losses;
}

double PpRun::eval_loss(const at::Tensor& global) {
  at::NoGradGuard no_grad;
  auto ids = rows(global);
  auto out = booster_->execute_pipeline([&] { return PipelineBatch{.input_ids = ids}; }, *boosted_.model, {},
                                        *boosted_.optimizer);
  return mean_over_dp(out.loss.item<double>());
}

double worst_rel_diff(const std::vector<double>& got, const std::vector<double>& ref) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - ref[i]) / std::abs(ref[i]));
  return worst;
}

void expect_curve(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double worst = worst_rel_diff(got, ref);
  EXPECT_LE(worst, 1e-5) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s: loss %.6f -> %.6f, max rel diff vs 1 process %.2e\n", what.c_str(), got.front(), got.back(),
                worst);
  }
}

void expect_layout_matches(HybridParallelPluginOptions options, const std::string& what, double max_norm) {
  options.max_norm = max_norm;
  for (const auto& base : {tiny_gpt2(), tiny_llama()}) {
    const auto config = deep(base);
    const auto& ref = reference(config, max_norm);
    PpRun run(config, options);
    expect_curve(run.train(0, kSteps), ref, fmt::format("{} {}", models::model_type(config), what));
  }
}

bool four_ranks() { return ct::world()->size() == 4; }

}  // namespace colossus::booster::testing
