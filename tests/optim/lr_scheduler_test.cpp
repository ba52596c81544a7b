// LR schedules against transformers' schedule functions (run by
// torch_oracle.py) over 130 steps, past the end of training, plus closed-form
// points, several groups, state roundtrip and validation.
#include "colossus/core/errors.h"
#include "colossus/optim/lr_scheduler.h"
#include "colossus/optim/sgd.h"
#include "tests/optim/torch_oracle.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <numbers>

namespace colossus::optim {
namespace {

const nlohmann::json& hf_schedules() {
  static const nlohmann::json result = [] {
    const auto path = testing::scratch_dir() / "schedules.json";
    std::string output;
    const int rc = testing::run_oracle("schedules '" + path.string() + "'", output);
    if (rc != 0) {
      ADD_FAILURE() << "torch_oracle.py schedules failed:\n" << output;
      return nlohmann::json();
    }
    return nlohmann::json::parse(std::ifstream(path));
  }();
  return result;
}

std::unique_ptr<LRScheduler> make(const std::string& name, Optimizer& opt) {
  if (name == "constant_w5") return std::make_unique<ConstantLR>(opt, ConstantLROptions{.warmup_steps = 5});
  if (name == "constant_w0") return std::make_unique<ConstantLR>(opt);
  if (name == "linear_w10_t100") {
    return std::make_unique<LinearWarmupDecayLR>(opt, LinearLROptions{.warmup_steps = 10, .total_steps = 100});
  }
  if (name == "linear_w0_t50") return std::make_unique<LinearWarmupDecayLR>(opt, LinearLROptions{.total_steps = 50});
  if (name == "cosine_w10_t100") {
    return std::make_unique<CosineWarmupLR>(opt, CosineLROptions{.warmup_steps = 10, .total_steps = 100});
  }
  if (name == "cosine_w7_t90_c1.5") {
    return std::make_unique<CosineWarmupLR>(opt,
                                            CosineLROptions{.warmup_steps = 7, .total_steps = 90, .num_cycles = 1.5});
  }
  if (name == "cosine_min_lr") {
    return std::make_unique<CosineWarmupLR>(opt,
                                            CosineLROptions{.warmup_steps = 10, .total_steps = 100, .min_lr = 3e-5});
  }
  if (name == "cosine_min_rate") {
    return std::make_unique<CosineWarmupLR>(
        opt, CosineLROptions{.warmup_steps = 10, .total_steps = 100, .min_lr_ratio = 0.1});
  }
  throw std::runtime_error("unknown schedule " + name);
}

TEST(LRSchedule, MatchesTransformers) {
  if (!testing::python_available()) GTEST_SKIP() << "no Python oracle at " COLOSSUS_PYTHON;
  const auto& hf = hf_schedules();
  ASSERT_FALSE(hf.is_null());
  const double base_lr = hf["base_lr"];
  ASSERT_EQ(hf["lrs"].size(), 8u);
  for (const auto& [name, lrs] : hf["lrs"].items()) {
    SGD opt(std::vector<at::Tensor>{at::zeros({1})}, {.lr = base_lr});
    auto sched = make(name, opt);
    for (size_t s = 0; s < lrs.size(); ++s) {
      if (s > 0) sched->step();
      const double expected = lrs[s];
      ASSERT_NEAR(sched->lr(), expected, 1e-15 * base_lr) << name << " at step " << s;
      ASSERT_EQ(sched->last_step(), static_cast<int64_t>(s));
    }
  }
}

TEST(LRSchedule, ClosedFormPoints) {
  SGD opt(std::vector<at::Tensor>{at::zeros({1})}, {.lr = 1.0});
  CosineWarmupLR cosine(opt, {.warmup_steps = 10, .total_steps = 110, .min_lr_ratio = 0.2});
  EXPECT_EQ(cosine.lr_at(0, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(cosine.lr_at(5, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(cosine.lr_at(10, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(cosine.lr_at(60, 1.0), 0.2 + 0.8 * 0.5);  // halfway down the half-cosine
  EXPECT_DOUBLE_EQ(cosine.lr_at(35, 1.0), 0.2 + 0.8 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)));
  EXPECT_DOUBLE_EQ(cosine.lr_at(110, 1.0), 0.2);
  LinearWarmupDecayLR linear(opt, {.warmup_steps = 4, .total_steps = 12});
  EXPECT_DOUBLE_EQ(linear.lr_at(2, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(linear.lr_at(8, 1.0), 0.5);
  EXPECT_EQ(linear.lr_at(12, 1.0), 0.0);
  EXPECT_EQ(linear.lr_at(20, 1.0), 0.0);  // clamped after the end
}

TEST(LRSchedule, EveryGroupScalesItsOwnBaseLr) {
  std::vector<ParamGroup> groups = {{.params = {at::zeros({1})}, .lr = 1e-3}, {.params = {at::zeros({1})}, .lr = 1e-4}};
  SGD opt(groups);
  CosineWarmupLR sched(opt, {.warmup_steps = 2, .total_steps = 10, .min_lr = 1e-5});
  EXPECT_EQ(sched.lrs(), (std::vector<double>{0.0, 0.0}));
  for (int i = 0; i < 10; ++i) sched.step();
  EXPECT_NEAR(opt.param_groups()[0].lr, 1e-5, 1e-18);
  EXPECT_NEAR(opt.param_groups()[1].lr, 1e-5, 1e-18);
  // Past total_steps the cosine goes on (as in transformers): progress 10/8.
  sched.step();
  sched.step();
  EXPECT_NEAR(sched.lr(), 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + std::cos(std::numbers::pi * 1.25)), 1e-15);
}

TEST(LRSchedule, StateRoundtripContinuesTheSameSequence) {
  SGD a(std::vector<at::Tensor>{at::zeros({1})}, {.lr = 0.1});
  CosineWarmupLR sa(a, {.warmup_steps = 5, .total_steps = 50});
  for (int i = 0; i < 17; ++i) sa.step();
  SGD b(std::vector<at::Tensor>{at::zeros({1})}, {.lr = 0.1});
  CosineWarmupLR sb(b, {.warmup_steps = 5, .total_steps = 50});
  sb.load_state_dict(sa.state_dict());
  EXPECT_EQ(sb.last_step(), 17);
  EXPECT_EQ(sb.lr(), sa.lr());
  for (int i = 0; i < 10; ++i) {
    sa.step();
    sb.step();
    ASSERT_EQ(sa.lr(), sb.lr());
  }
  LinearWarmupDecayLR other(b, {.total_steps = 10});
  EXPECT_THROW(other.load_state_dict(sa.state_dict()), CheckpointError);
  EXPECT_THROW(sb.load_state_dict("[1, 2"), CheckpointError);
  // Issue 21: a negative step made the warmup lr negative; base lrs must be usable lrs.
  EXPECT_THROW(sb.load_state_dict(R"({"scheduler": "cosine", "step": -3, "base_lrs": [0.1]})"), CheckpointError);
  EXPECT_THROW(sb.load_state_dict(R"({"scheduler": "cosine", "step": 3, "base_lrs": [-0.1]})"), CheckpointError);
  EXPECT_EQ(sb.last_step(), 27) << "a refused state changes nothing";
}

TEST(LRSchedule, InvalidOptionsAreConfigErrors) {
  SGD opt(std::vector<at::Tensor>{at::zeros({1})}, {.lr = 1e-3});
  EXPECT_THROW(LinearWarmupDecayLR(opt, {.warmup_steps = 1}), ConfigError);  // no total_steps
  EXPECT_THROW(ConstantLR(opt, {.warmup_steps = -1}), ConfigError);
  EXPECT_THROW(CosineWarmupLR(opt, {.total_steps = 10, .min_lr_ratio = 1.5}), ConfigError);
  EXPECT_THROW(CosineWarmupLR(opt, {.total_steps = 10, .min_lr = 1e-2}), ConfigError);  // above the base lr
  EXPECT_THROW(CosineWarmupLR(opt, {.total_steps = 10, .min_lr_ratio = 0.1, .min_lr = 1e-5}), ConfigError);
}

}  // namespace
}  // namespace colossus::optim
