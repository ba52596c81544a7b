// The ZeRO test harness (see zero_testing.h).
#include "tests/zero/zero_testing.h"

#include "colossus/amp/clip_grad.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/models/lazy_init.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/optim/lamb.h"
#include "colossus/optim/lr_scheduler.h"
#include "colossus/optim/sgd.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>

namespace colossus::zero::testing {

namespace bt = colossus::booster::testing;
namespace ct = colossus::testing;

namespace {

constexpr uint64_t kModelSeed = 7;

models::ModelConfig config_of(const RunSpec& spec) {
  if (spec.model == "phi3") return bt::tiny_phi3();
  return spec.model == "gpt2" ? bt::tiny_gpt2() : bt::tiny_llama();
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, models::CausalLM& model) {
  auto params = model.parameters();
  if (name == "adamw")
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
  if (name == "adam")
    return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 3e-3, .weight_decay = 0.01});
  if (name == "sgd") return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.2, .momentum = 0.9});
  if (name == "lamb")
    return std::make_unique<optim::Lamb>(params, optim::LambOptions{.lr = 1e-2, .weight_decay = 0.01});
  if (name == "hybrid_adam") {
    return std::make_unique<optim::HybridAdam>(params, optim::HybridAdamOptions{.lr = 3e-3, .weight_decay = 0.01});
  }
  throw std::runtime_error("unknown optimizer " + name);
}

std::shared_ptr<optim::LRScheduler> make_scheduler(optim::Optimizer& optimizer) {
  return std::make_shared<optim::CosineWarmupLR>(optimizer,
                                                 optim::CosineLROptions{.warmup_steps = 4, .total_steps = bt::kSteps});
}

}  // namespace

double worst_rel_diff(const std::vector<double>& got, const std::vector<double>& reference) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size() && i < reference.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - reference[i]) / std::abs(reference[i]));
  }
  return worst;
}

std::vector<double> reference_losses(const RunSpec& spec, int64_t steps) {
  const auto config = config_of(spec);
  auto model = models::create_model(config, {.seed = kModelSeed});
  auto optimizer = make_optimizer(spec.optimizer, *model);
  auto scheduler = make_scheduler(*optimizer);
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    auto ids = bt::global_batch(config, step);
    auto loss = model->loss(model->forward(ids), ids);
    loss.backward();
    if (spec.max_norm > 0.0) {
      std::vector<at::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad());
      at::NoGradGuard no_grad;
      amp::clip_grad_norm(grads, spec.max_norm);
    }
    optimizer->step();
    scheduler->step();
    optimizer->zero_grad();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

ZeroRun::ZeroRun(const RunSpec& spec, cluster::ProcessGroupPtr group)
    : spec_(spec), group_(group ? group : ct::world()) {
  std::shared_ptr<booster::Plugin> plugin;
  booster::BoosterOptions booster_options;
  auto model = spec.lazy_init ? models::create_lazy_model(config_of(spec))
                              : models::create_model(config_of(spec), {.seed = kModelSeed});
  if (spec.plugin == "gemini") {
    plugin = std::make_shared<booster::GeminiPlugin>(
        booster::GeminiPluginOptions{
            .gemini = {.placement_policy = spec.placement_policy,
                       .shard_param_frac = spec.shard_param_frac,
                       .offload_optim_frac = spec.offload_optim_frac,
                       .offload_param_frac = spec.offload_param_frac,
                       .gpu_margin_mem_ratio = spec.gpu_margin_mem_ratio,
                       .precision = spec.precision,
                       .master_weights = spec.master_weights,
                       .max_prefetch = spec.max_prefetch,
                       .enable_gradient_accumulation = spec.micro_batches > 1,
                       .loss_scaler = {.initial_scale = spec.initial_scale, .max_scale = 4294967296.0},
                       .max_norm = spec.max_norm,
                       .memory_probe = spec.memory_probe,
                       .memory_peak_reset = spec.memory_peak_reset,
                       .host_budget_probe = spec.host_budget_probe,
                       .param_source =
                           spec.lazy_init ? models::seeded_source(model, kModelSeed) : models::ParamSource(),
                       .nvme_offload_fraction = spec.nvme_offload_fraction,
                       .nvme_offload_dir = spec.nvme_offload_dir,
                       .nvme_direct_io = spec.nvme_direct_io,
                       .fp8_communication = spec.fp8_communication},
            .search_range_m = spec.search_range_m,
            .min_chunk_size_m = spec.min_chunk_size_m},
        group_);
  } else if (spec.plugin == "ddp") {
    plugin = std::make_shared<booster::DDPPlugin>(booster::DDPPluginOptions{}, group_);
    booster_options.mixed_precision = spec.precision;
    booster_options.max_norm = spec.max_norm;
  } else {
    plugin = std::make_shared<booster::LowLevelZeroPlugin>(
        booster::LowLevelZeroPluginOptions{.stage = spec.stage,
                                           .precision = spec.precision,
                                           .loss_scaler = {.initial_scale = spec.initial_scale, .max_scale = 4294967296.0},
                                           .max_norm = spec.max_norm,
                                           .reduce_bucket_size_in_m = spec.bucket_size_in_m,
                                           .communication_dtype = spec.communication_dtype,
                                           .fp8_communication = spec.fp8_communication,
                                           .overlap_allgather = spec.overlap_allgather,
                                           .cpu_offload = spec.cpu_offload,
                                           .master_weights = spec.master_weights,
                                           .extra_dp_size = spec.extra_dp_size},
        group_);
  }
  booster_ = std::make_unique<booster::Booster>(plugin, booster_options);
  auto optimizer = make_optimizer(spec.optimizer, *model);
  auto scheduler = make_scheduler(*optimizer);
  boosted_ = booster_->boost(model, std::move(optimizer), scheduler, /*dataloader=*/nullptr,
                             spec.lazy_init ? models::seeded_source(model, kModelSeed) : models::ParamSource());
}

double ZeroRun::train_step(int64_t step) {
  const int64_t rows = bt::kGlobalBatch / group_->size();
  auto local = bt::global_batch(config_of(spec_), step).narrow(0, group_->rank() * rows, rows);
  auto micro = local.chunk(spec_.micro_batches, 0);
  auto& model = *boosted_.model;
  double local_loss = 0.0;
  for (size_t m = 0; m < micro.size(); ++m) {
    auto run = [&] {
      auto ids = micro[m];
      auto loss = model.unwrap().loss(model.forward(ids), ids).to(at::kFloat) / static_cast<double>(micro.size());
      booster_->backward(loss, *boosted_.optimizer);
      local_loss += loss.item<double>();
    };
    if (m + 1 < micro.size()) {
      auto no_sync = booster_->no_sync(model);
      run();
    } else {
      run();
    }
  }
  boosted_.optimizer->step();
  boosted_.lr_scheduler->step();
  boosted_.optimizer->zero_grad();
  auto total = at::full({1}, local_loss, at::kDouble);
  group_->all_reduce(total).wait();
  return total.item<double>() / group_->size();
}

std::vector<double> ZeroRun::train(int64_t first_step, int64_t end_step) {
  std::vector<double> losses;
  for (int64_t step = first_step; step < end_step; ++step) losses.push_back(train_step(step));
  return losses;
}

void ZeroRun::save(const std::string& dir, bool shard) {
  booster_->save_model(*boosted_.model, dir, {.shard = shard});
  booster_->save_optimizer(*boosted_.optimizer, dir, {.shard = shard});
  booster_->save_lr_scheduler(*boosted_.lr_scheduler, (std::filesystem::path(dir) / "scheduler.json").string());
}

void ZeroRun::load(const std::string& dir) {
  booster_->load_model(*boosted_.model, dir);
  booster_->load_optimizer(*boosted_.optimizer, dir);
  booster_->load_lr_scheduler(*boosted_.lr_scheduler, (std::filesystem::path(dir) / "scheduler.json").string());
}

}  // namespace colossus::zero::testing
