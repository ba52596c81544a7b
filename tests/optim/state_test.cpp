// state_dict()/load_state_dict(): a run that is saved (through a real
// safetensors file), restored into a fresh optimizer and continued must be bit
// for bit the run that never stopped; mismatched states are refused. Also the
// Optimizer base (zero_grad, set_lr) and option validation.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/optim/lamb.h"
#include "colossus/optim/sgd.h"
#include "tests/optim/torch_oracle.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>

namespace colossus::optim {
namespace {

using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<at::Tensor>)>;

std::vector<at::Tensor> random_params(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randn({17, 9}, gen), at::randn({100003}, gen), at::randn({5}, gen)};
}

// Deterministic grads for step `s`: both runs see the same ones.
void set_grads(std::vector<at::Tensor>& params, int s) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + s);
  for (auto& p : params) p.mutable_grad() = at::randn(p.sizes(), gen);
  if (s % 4 == 1) params[2].mutable_grad().reset();  // a param without a grad now and then
}

OptimizerState through_file(const OptimizerState& state, const std::string& tag) {
  const auto path = (testing::scratch_dir() / (tag + ".safetensors")).string();
  checkpoint::save_safetensors(path, state.tensors, {{"optimizer", state.json}});
  auto file = checkpoint::SafetensorsFile::open(path);
  OptimizerState loaded;
  for (const auto& key : file.keys()) loaded.tensors.emplace_back(key, file.get(key).clone());
  loaded.json = file.metadata().at("optimizer");
  return loaded;
}

struct Named {
  std::string name;
  Factory make;
};

class Resume : public ::testing::TestWithParam<Named> {};

TEST_P(Resume, ContinuesBitForBit) {
  const Factory& make = GetParam().make;
  auto params = random_params(7);
  auto optimizer = make(params);
  for (int s = 0; s < 6; ++s) {
    set_grads(params, s);
    optimizer->step();
    if (s == 2) optimizer->set_lr(0.004);  // a changed hyper-parameter must come back too
  }
  const OptimizerState saved = through_file(optimizer->state_dict(), GetParam().name);
  std::vector<at::Tensor> resumed_params;
  for (const auto& p : params) resumed_params.push_back(p.detach().clone());
  auto resumed = make(resumed_params);
  resumed->load_state_dict(saved);
  EXPECT_EQ(resumed->param_groups()[0].lr, 0.004);
  for (int s = 6; s < 12; ++s) {
    set_grads(params, s);
    set_grads(resumed_params, s);
    optimizer->step();
    resumed->step();
  }
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i], resumed_params[i])) << "param " << i;
  const auto a = optimizer->state_dict(), b = resumed->state_dict();
  EXPECT_EQ(a.json, b.json);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].first, b.tensors[i].first);
    EXPECT_TRUE(at::equal(a.tensors[i].second, b.tensors[i].second)) << a.tensors[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, Resume,
    ::testing::Values(
        Named{"SGD", [](auto p) { return std::make_unique<SGD>(p, SGDOptions{.lr = 0.1, .momentum = 0.9}); }},
        Named{"Adam", [](auto p) { return std::make_unique<Adam>(p, AdamOptions{.lr = 1e-2, .weight_decay = 0.1}); }},
        Named{"AdamWAmsgrad",
              [](auto p) { return std::make_unique<AdamW>(p, AdamWOptions{.lr = 1e-2, .amsgrad = true}); }},
        Named{"Lamb", [](auto p) { return std::make_unique<Lamb>(p, LambOptions{.lr = 1e-2}); }},
        Named{"HybridAdam",
              [](auto p) { return std::make_unique<HybridAdam>(p, HybridAdamOptions{.lr = 1e-2, .weight_decay = 0.1}); }}),
    [](const auto& info) { return info.param.name; });

TEST(LoadState, RefusesAnotherOptimizersState) {
  auto params = random_params(1);
  AdamW adamw(params);
  set_grads(params, 0);
  adamw.step();
  SGD sgd(random_params(1), {.momentum = 0.9});
  EXPECT_THROW(sgd.load_state_dict(adamw.state_dict()), CheckpointError);
}

TEST(LoadState, RefusesWrongShapesAndCounts) {
  auto params = random_params(1);
  AdamW adamw(params);
  set_grads(params, 0);
  adamw.step();
  const auto state = adamw.state_dict();
  AdamW fewer(std::vector<at::Tensor>{params[0], params[1]});
  EXPECT_THROW(fewer.load_state_dict(state), CheckpointError);
  AdamW reshaped(std::vector<at::Tensor>{at::zeros({9, 17}), params[1].clone(), params[2].clone()});
  try {
    reshaped.load_state_dict(state);
    FAIL() << "a state of shape [17, 9] loaded into a [9, 17] parameter";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("[17, 9]"), std::string::npos) << e.what();
  }
  // A failed load leaves the optimizer as it was.
  EXPECT_EQ(reshaped.state_dict().tensors.size(), 0u);
  EXPECT_THROW(reshaped.load_state_dict({{}, "{not json"}), CheckpointError);
}

// Issue 21: a loaded state is range-checked, and a missing moment is an error
// rather than zeros (which would silently change the resumed trajectory).
TEST(LoadState, RefusesNegativeStepsAndMissingOrIntegerMoments) {
  auto params = random_params(1);
  AdamW adamw(params);
  set_grads(params, 0);
  adamw.step();
  const auto state = adamw.state_dict();
  auto message_of = [&](const OptimizerState& bad) {
    AdamW fresh(std::vector<at::Tensor>{params[0].clone(), params[1].clone(), params[2].clone()});
    try {
      fresh.load_state_dict(bad);
    } catch (const CheckpointError& e) {
      EXPECT_EQ(fresh.state_dict().tensors.size(), 0u) << "a failed load changes nothing";
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  OptimizerState negative = state;
  const auto step_at = negative.json.find("\"step\":1");
  ASSERT_NE(step_at, std::string::npos) << negative.json;
  negative.json.replace(step_at, 8, "\"step\":-1");
  EXPECT_NE(message_of(negative).find("step -1"), std::string::npos);
  OptimizerState missing = state;
  std::erase_if(missing.tensors, [](const auto& t) { return t.first == "state.1.exp_avg_sq"; });
  EXPECT_NE(message_of(missing).find("lacks 'state.1.exp_avg_sq'"), std::string::npos);
  OptimizerState integer = state;
  integer.tensors[0].second = integer.tensors[0].second.to(at::kInt);
  EXPECT_NE(message_of(integer).find("floating point"), std::string::npos);
  // SGD without momentum keeps no moments: nothing is required.
  auto sgd_params = random_params(1);
  SGD plain(sgd_params, {.lr = 0.1});
  set_grads(sgd_params, 0);
  plain.step();
  SGD again(std::vector<at::Tensor>{sgd_params[0].clone(), sgd_params[1].clone(), sgd_params[2].clone()}, {.lr = 0.1});
  EXPECT_NO_THROW(again.load_state_dict(plain.state_dict()));
}

TEST(OptimizerBase, ZeroGradAndSetLr) {
  auto params = random_params(2);
  SGD sgd(params, {.lr = 0.1});
  set_grads(params, 0);
  sgd.zero_grad(/*set_to_none=*/false);
  EXPECT_TRUE(params[0].grad().defined());
  EXPECT_EQ(params[0].grad().abs().sum().item<float>(), 0.0f);
  sgd.zero_grad();
  EXPECT_FALSE(params[0].grad().defined());
  sgd.set_lr(0.25);
  EXPECT_EQ(sgd.param_groups()[0].lr, 0.25);
  // A step with no grads changes nothing.
  auto before = params[1].clone();
  sgd.step();
  EXPECT_TRUE(at::equal(before, params[1]));
}

template <typename F>
void expect_config_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError; expected one mentioning '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Options, InvalidValuesAreNamed) {
  std::vector<at::Tensor> p = {at::zeros({3})};
  expect_config_error([&] { AdamW(p, {.lr = -1.0}); }, "lr=-1");
  expect_config_error([&] { AdamW(p, {.betas = {1.0, 0.999}}); }, "beta1=1");
  expect_config_error([&] { Adam(p, {.betas = {0.9, -0.1}}); }, "beta2=-0.1");
  expect_config_error([&] { AdamW(p, {.eps = -1e-8}); }, "eps=-1e-08");
  expect_config_error([&] { AdamW(p, {.weight_decay = -0.1}); }, "weight_decay=-0.1");
  expect_config_error([&] { SGD(p, {.momentum = -0.5}); }, "momentum=-0.5");
  expect_config_error([&] { SGD(p, {.nesterov = true}); }, "nesterov needs momentum > 0");
  expect_config_error([&] { SGD(p, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); }, "dampening=0.1");
  expect_config_error([&] { Lamb(p, {.max_grad_norm = -1.0}); }, "max_grad_norm=-1");
  expect_config_error([&] { HybridAdam(p, {.num_threads = -2}); }, "num_threads=-2");
  expect_config_error([&] { AdamW(std::vector<at::Tensor>{at::zeros({3}, at::kLong)}); }, "Long");
  std::vector<ParamGroup> groups = {{.params = p, .lr = 1e-3, .options = {{"momentum", 0.9}}}};
  expect_config_error([&] { AdamW(groups, {}); }, "'momentum'");
  std::vector<ParamGroup> plain = {{.params = p, .lr = 1e-3}};
  expect_config_error([&] { AdamW(plain, {.lr = 3e-4}); }, "set them on the groups");
  // Options the groups lack come from the options struct.
  AdamW filled(plain, {.betas = {0.8, 0.9}});
  EXPECT_EQ(filled.param_groups()[0].options.at("beta1"), 0.8);
  EXPECT_EQ(filled.param_groups()[0].options.at("beta2"), 0.9);
}

}  // namespace
}  // namespace colossus::optim
