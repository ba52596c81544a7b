#include "colossus/optim/lr_scheduler.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace colossus::optim {

namespace {

void check_steps(const std::string& scheduler, int64_t warmup_steps, int64_t total_steps, bool total_required) {
  if (warmup_steps < 0) {
    throw ConfigError(fmt::format("{} schedule: warmup_steps={} is negative; use 0 or more", scheduler, warmup_steps));
  }
  if (total_required && total_steps <= 0) {
    throw ConfigError(fmt::format("{} schedule: total_steps={} must be > 0, e.g. the number of training steps",
                                  scheduler, total_steps));
  }
}

// transformers' warmup ramp: step / max(1, warmup_steps).
double warmup_factor(int64_t step, int64_t warmup_steps) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
}

}  // namespace

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(&optimizer) {
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.lr);
}

void LRScheduler::start() { apply(); }

void LRScheduler::apply() {
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size() && g < base_lrs_.size(); ++g) groups[g].lr = lr_at(step_, base_lrs_[g]);
}

void LRScheduler::attach(Optimizer& optimizer) {
  if (optimizer.param_groups().size() != base_lrs_.size()) {
    throw ConfigError(fmt::format("{} schedule: cannot attach to {} with {} param groups; it was built on an optimizer "
                                  "with {} (attach it to the wrapper of that optimizer)",
                                  name(), optimizer.name(), optimizer.param_groups().size(), base_lrs_.size()));
  }
  optimizer_ = &optimizer;
  apply();
}

void LRScheduler::step() {
  ++step_;
  apply();
}

double LRScheduler::lr() const {
  const auto& groups = optimizer_->param_groups();
  return groups.empty() ? 0.0 : groups[0].lr;
}

std::vector<double> LRScheduler::lrs() const {
  std::vector<double> out;
  for (const auto& group : optimizer_->param_groups()) out.push_back(group.lr);
  return out;
}

std::string LRScheduler::state_dict() const {
  return nlohmann::json{{"scheduler", name()}, {"step", step_}, {"base_lrs", base_lrs_}}.dump();
}

void LRScheduler::load_state_dict(const std::string& json) {
  try {
    const auto j = nlohmann::json::parse(json);
    if (j.at("scheduler").get<std::string>() != name()) {
      throw CheckpointError(fmt::format("LR scheduler state is for '{}', but this scheduler is '{}'",
                                        j.at("scheduler").get<std::string>(), name()));
    }
    auto base = j.at("base_lrs").get<std::vector<double>>();
    if (base.size() != optimizer_->param_groups().size()) {
      throw CheckpointError(fmt::format("LR scheduler state has {} base lrs but the optimizer has {} param groups",
                                        base.size(), optimizer_->param_groups().size()));
    }
    for (size_t g = 0; g < base.size(); ++g) {
      if (!(base[g] >= 0.0) || !std::isfinite(base[g])) {
        throw CheckpointError(fmt::format("LR scheduler state has base lr {} for param group {}; use a finite lr >= 0",
                                          base[g], g));
      }
    }
    const int64_t step = j.at("step").get<int64_t>();
    if (step < 0) throw CheckpointError(fmt::format("LR scheduler state has step {}; a step count is >= 0", step));
    base_lrs_ = std::move(base);
    step_ = step;
    apply();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("LR scheduler state does not parse: {}", e.what()));
  }
}

ConstantLR::ConstantLR(Optimizer& optimizer, ConstantLROptions options) : LRScheduler(optimizer), options_(options) {
  check_steps(name(), options.warmup_steps, 0, false);
  start();
}

double ConstantLR::lr_at(int64_t step, double base_lr) const {
  return base_lr * (step < options_.warmup_steps ? warmup_factor(step, options_.warmup_steps) : 1.0);
}

LinearWarmupDecayLR::LinearWarmupDecayLR(Optimizer& optimizer, LinearLROptions options)
    : LRScheduler(optimizer), options_(options) {
  check_steps(name(), options.warmup_steps, options.total_steps, true);
  start();
}

double LinearWarmupDecayLR::lr_at(int64_t step, double base_lr) const {
  const auto [warmup, total] = std::pair{options_.warmup_steps, options_.total_steps};
  if (step < warmup) return base_lr * warmup_factor(step, warmup);
  return base_lr * std::max(0.0, static_cast<double>(total - step) /
                                     static_cast<double>(std::max<int64_t>(1, total - warmup)));
}

CosineWarmupLR::CosineWarmupLR(Optimizer& optimizer, CosineLROptions options)
    : LRScheduler(optimizer), options_(options) {
  check_steps(name(), options.warmup_steps, options.total_steps, true);
  if (!(options.min_lr_ratio >= 0.0 && options.min_lr_ratio <= 1.0)) {
    throw ConfigError(fmt::format("cosine schedule: min_lr_ratio={} is outside [0, 1]; e.g. 0.1", options.min_lr_ratio));
  }
  if (!(options.min_lr >= 0.0)) {
    throw ConfigError(fmt::format("cosine schedule: min_lr={} is negative; use 0 or more", options.min_lr));
  }
  if (options.min_lr > 0.0 && options.min_lr_ratio > 0.0) {
    throw ConfigError(fmt::format("cosine schedule: both min_lr={} and min_lr_ratio={} are set; set one",
                                  options.min_lr, options.min_lr_ratio));
  }
  for (double base : base_lrs()) {
    if (options.min_lr > base) {
      throw ConfigError(fmt::format("cosine schedule: min_lr={} exceeds a param group's lr {}; use min_lr <= {}",
                                    options.min_lr, base, base));
    }
  }
  if (!(options.num_cycles > 0.0)) {
    throw ConfigError(fmt::format("cosine schedule: num_cycles={} must be > 0, e.g. 0.5", options.num_cycles));
  }
  start();
}

double CosineWarmupLR::lr_at(int64_t step, double base_lr) const {
  const auto [warmup, total] = std::pair{options_.warmup_steps, options_.total_steps};
  if (step < warmup) return base_lr * warmup_factor(step, warmup);
  const double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * options_.num_cycles * 2.0 * progress));
  double min_rate = options_.min_lr_ratio;
  if (options_.min_lr > 0.0) min_rate = base_lr > 0.0 ? options_.min_lr / base_lr : 0.0;
  factor = factor * (1.0 - min_rate) + min_rate;
  return base_lr * std::max(0.0, factor);
}

}  // namespace colossus::optim
