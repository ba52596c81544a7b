// Each optimizer against torch.optim (Lamb: against a plain PyTorch reference
// in torch_oracle.py) over 20 steps on a few random tensors: the same initial
// params and grads in, the params after every step compared. The reference
// paths mirror torch's single-tensor ATen calls, so they must agree bit for
// bit; HybridAdam's fused kernel orders float operations differently from
// torch (no lerp/FMA), so it must agree within 1e-6 relative.
#include "colossus/optim/adam.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/optim/lamb.h"
#include "colossus/optim/sgd.h"
#include "tests/optim/torch_oracle.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace colossus::optim {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// name, reference (what torch_oracle.py runs), ours (if different), tolerance.
const char* const kCases = R"([
  {"name": "sgd_plain", "optimizer": "SGD", "kwargs": {"lr": 0.1}},
  {"name": "sgd_momentum_dampening_wd", "optimizer": "SGD",
   "kwargs": {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}},
  {"name": "sgd_nesterov", "optimizer": "SGD",
   "kwargs": {"lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 0.001}},
  {"name": "adam_l2", "optimizer": "Adam",
   "kwargs": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-7, "weight_decay": 0.1}},
  {"name": "adam_amsgrad", "optimizer": "Adam", "kwargs": {"lr": 0.01, "amsgrad": true}},
  {"name": "adamw", "optimizer": "AdamW",
   "kwargs": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  {"name": "adamw_amsgrad", "optimizer": "AdamW", "kwargs": {"lr": 0.003, "weight_decay": 0.05, "amsgrad": true}},
  {"name": "adamw_groups_and_skips", "optimizer": "AdamW", "kwargs": {"lr": 0.01, "weight_decay": 0.1},
   "groups": [{"indices": [0, 2], "lr": 0.02}, {"indices": [1, 3, 4], "weight_decay": 0.0}],
   "skip": [[0, 1], [3, 0], [3, 4], [7, 2], [12, 1]]},
  {"name": "adamw_bf16", "optimizer": "AdamW", "dtype": "bfloat16",
   "kwargs": {"lr": 0.01, "weight_decay": 0.1}},
  {"name": "sgd_fp16", "optimizer": "SGD", "dtype": "float16", "kwargs": {"lr": 0.05, "momentum": 0.9}},
  {"name": "lamb_fused_defaults", "optimizer": "Lamb",
   "kwargs": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01, "bias_correction": true,
              "adam_w_mode": true, "grad_averaging": true, "use_nvlamb": false, "max_grad_norm": 0.0}},
  {"name": "lamb_l2_nvlamb_no_bias_correction", "optimizer": "Lamb",
   "kwargs": {"lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.02, "bias_correction": false,
              "adam_w_mode": false, "grad_averaging": false, "use_nvlamb": true, "max_grad_norm": 0.0}},
  {"name": "lamb_no_decay_clipped", "optimizer": "Lamb", "grad_scale": 3.0,
   "kwargs": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.0, "bias_correction": true,
              "adam_w_mode": true, "grad_averaging": true, "use_nvlamb": false, "max_grad_norm": 1.0}},
  {"name": "hybrid_adam_vs_adamw", "optimizer": "AdamW",
   "kwargs": {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
   "ours": "HybridAdam", "ours_kwargs": {"adamw_mode": true}, "tolerance": 1e-6},
  {"name": "hybrid_adam_vs_adam_l2", "optimizer": "Adam",
   "kwargs": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.05},
   "ours": "HybridAdam", "ours_kwargs": {"adamw_mode": false}, "tolerance": 1e-6},
  {"name": "hybrid_adam_groups_and_skips", "optimizer": "AdamW", "kwargs": {"lr": 0.01, "weight_decay": 0.1},
   "groups": [{"indices": [0, 2], "lr": 0.02}, {"indices": [1, 3, 4], "weight_decay": 0.0}],
   "skip": [[0, 1], [3, 0], [3, 4], [7, 2], [12, 1]],
   "ours": "HybridAdam", "ours_kwargs": {"adamw_mode": true}, "tolerance": 1e-6}
])";

json cases_with_defaults() {
  json cases = json::parse(kCases);
  int seed = 100;
  for (auto& c : cases) {
    c["seed"] = seed++;
    c["steps"] = 20;
    // Sizes that exercise the SIMD tails and the thread split of HybridAdam.
    if (!c.contains("shapes")) c["shapes"] = json::parse("[[64, 33], [129], [7, 5, 3], [1], [70001]]");
  }
  return cases;
}

// Runs the oracle once for all cases; returns the folder with <case>.safetensors.
const fs::path& reference_dir() {
  static const fs::path dir = [] {
    fs::path out = testing::scratch_dir() / "trajectories";
    fs::create_directories(out);
    std::ofstream(testing::scratch_dir() / "trajectories.json") << cases_with_defaults().dump();
    std::string output;
    const int rc = testing::run_oracle(
        fmt::format("trajectories '{}' '{}'", (testing::scratch_dir() / "trajectories.json").string(), out.string()),
        output);
    if (rc != 0) ADD_FAILURE() << "torch_oracle.py trajectories failed:\n" << output;
    return out;
  }();
  return dir;
}

Betas betas_of(const json& kw, Betas fallback) {
  if (!kw.contains("betas")) return fallback;
  return {kw["betas"][0].get<double>(), kw["betas"][1].get<double>()};
}

std::unique_ptr<Optimizer> make_optimizer(const json& c, const std::vector<at::Tensor>& params) {
  const std::string kind = c.value("ours", c["optimizer"].get<std::string>());
  const json& kw = c["kwargs"];
  json ours_kw = c.value("ours_kwargs", json::object());
  // Groups: torch takes lr/weight_decay from the kwargs where a group lacks them.
  std::vector<ParamGroup> groups;
  if (c.contains("groups")) {
    for (const auto& g : c["groups"]) {
      ParamGroup group;
      for (int i : g["indices"]) group.params.push_back(params[static_cast<size_t>(i)]);
      group.lr = g.value("lr", kw.value("lr", 1e-3));
      group.weight_decay = g.value("weight_decay", kw.value("weight_decay", kind == "AdamW" ? 1e-2 : 0.0));
      groups.push_back(group);
    }
  }
  const bool grouped = !groups.empty();
  const double lr = kw.value("lr", 1e-3);
  if (kind == "SGD") {
    SGDOptions o{.lr = lr,
                 .momentum = kw.value("momentum", 0.0),
                 .dampening = kw.value("dampening", 0.0),
                 .weight_decay = kw.value("weight_decay", 0.0),
                 .nesterov = kw.value("nesterov", false)};
    return grouped ? std::make_unique<SGD>(groups, SGDOptions{.momentum = o.momentum, .dampening = o.dampening,
                                                              .nesterov = o.nesterov})
                   : std::make_unique<SGD>(params, o);
  }
  if (kind == "Adam" || kind == "AdamW") {
    AdamWOptions o{.lr = lr,
                   .betas = betas_of(kw, {}),
                   .eps = kw.value("eps", 1e-8),
                   .weight_decay = kw.value("weight_decay", kind == "AdamW" ? 1e-2 : 0.0),
                   .amsgrad = kw.value("amsgrad", false)};
    if (kind == "AdamW") {
      return grouped ? std::make_unique<AdamW>(groups, AdamWOptions{.betas = o.betas, .eps = o.eps, .amsgrad = o.amsgrad})
                     : std::make_unique<AdamW>(params, o);
    }
    AdamOptions a{.lr = o.lr, .betas = o.betas, .eps = o.eps, .weight_decay = o.weight_decay, .amsgrad = o.amsgrad};
    return grouped ? std::make_unique<Adam>(groups, AdamOptions{.betas = a.betas, .eps = a.eps, .amsgrad = a.amsgrad})
                   : std::make_unique<Adam>(params, a);
  }
  if (kind == "Lamb") {
    LambOptions o{.lr = lr,
                  .betas = betas_of(kw, {}),
                  .eps = kw["eps"],
                  .weight_decay = kw["weight_decay"],
                  .bias_correction = kw["bias_correction"],
                  .adam_w_mode = kw["adam_w_mode"],
                  .grad_averaging = kw["grad_averaging"],
                  .use_nvlamb = kw["use_nvlamb"],
                  .max_grad_norm = kw["max_grad_norm"]};
    return std::make_unique<Lamb>(params, o);
  }
  if (kind == "HybridAdam") {
    HybridAdamOptions o{.lr = lr,
                        .betas = betas_of(kw, {}),
                        .eps = kw.value("eps", 1e-8),
                        .weight_decay = kw.value("weight_decay", 0.0),
                        .adamw_mode = ours_kw.value("adamw_mode", true)};
    if (grouped) {
      return std::make_unique<HybridAdam>(groups,
                                          HybridAdamOptions{.betas = o.betas, .eps = o.eps, .adamw_mode = o.adamw_mode});
    }
    return std::make_unique<HybridAdam>(params, o);
  }
  throw std::runtime_error("unknown optimizer " + kind);
}

class TorchParity : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { at::set_num_threads(1); }
};

TEST_P(TorchParity, TwentyStepsMatchTorch) {
  if (!testing::python_available()) GTEST_SKIP() << "no Python oracle at " COLOSSUS_PYTHON;
  json spec;
  for (const auto& c : cases_with_defaults()) {
    if (c["name"] == GetParam()) spec = c;
  }
  const auto ref = testing::read_tensors(reference_dir() / (GetParam() + ".safetensors"));
  const size_t n = spec["shapes"].size();
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < n; ++i) params.push_back(ref.at(fmt::format("p0.{}", i)).clone());
  auto optimizer = make_optimizer(spec, params);
  const double tolerance = spec.value("tolerance", 0.0);
  double worst = 0.0;
  for (int s = 0; s < spec["steps"].get<int>(); ++s) {
    for (size_t i = 0; i < n; ++i) {
      auto it = ref.find(fmt::format("g.{}.{}", s, i));
      if (it == ref.end()) {
        params[i].mutable_grad().reset();
      } else {
        params[i].mutable_grad() = it->second.clone();
      }
    }
    optimizer->step();
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& expected = ref.at(fmt::format("p.{}.{}", s, i));
      ASSERT_EQ(params[i].scalar_type(), expected.scalar_type());
      const double rel = testing::max_rel_diff(params[i], expected);
      worst = std::max(worst, rel);
      ASSERT_LE(rel, tolerance) << "step " << s << ", tensor " << i << " (" << params[i].sizes() << ")";
    }
  }
  RecordProperty("max_rel_diff", fmt::format("{:.3g}", worst));
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& c : json::parse(kCases)) names.push_back(c["name"]);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TorchParity, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace colossus::optim
