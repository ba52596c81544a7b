// GraphedTrainStep and the device-step mode under it: bad setups are
// ConfigErrors naming what is missing (on every build); on a CUDA device
// (skipped elsewhere) replayed steps give the eager steps' losses, the step
// count reaches the optimizer's state, and 50 bf16 steps (CUDA graph on a GPU,
// the eager mixed-precision step on a CPU build) track the CPU fp32 curve.
#include "colossus/amp/graphed_train_step.h"
#include "colossus/core/errors.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/hybrid_adam.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace colossus::amp {
namespace {

const optim::HybridAdamOptions kAdam{.lr = 3e-3, .betas = {0.9, 0.95}, .weight_decay = 0.1, .adamw_mode = true};

bool cuda_here() { return at::hasCUDA() && kernels::cuda_slots().make_device_graph != nullptr; }

std::unique_ptr<MixedPrecisionOptimizer> mixed_adam(const std::shared_ptr<models::CausalLM>& model,
                                                    MixedPrecisionOptions options = {}) {
  return std::make_unique<MixedPrecisionOptimizer>(std::make_unique<optim::HybridAdam>(model->parameters(), kAdam),
                                                   std::move(options));
}

// Token batches with structure a tiny model learns in a few dozen steps:
// each row counts up by its own stride.
at::Tensor batch_at(int step, int64_t batch = 4, int64_t len = 32) {
  const at::Tensor pos = at::arange(len, at::kLong).unsqueeze(0);
  const at::Tensor stride = (at::arange(batch, at::kLong) + step % 3 + 1).unsqueeze(1);
  return (pos * stride + step) % 128;
}

TEST(GraphedTrainStep, BadSetupsAreConfigErrors) {
  auto model = models::create_model(models::preset("gpt2-tiny"), {.seed = 1, .dtype = at::kBFloat16});
  auto loss_fn = [&](const at::Tensor& ids) { return model->forward_loss(ids, ids); };
  {
    auto opt = mixed_adam(model);
    EXPECT_THROW(GraphedTrainStep(loss_fn, *opt, {.eager_steps = 0}), ConfigError);
  }
  {
    // Clipping reads the norm on the host: no device-step form.
    auto opt = mixed_adam(model, {.precision = "bf16", .max_norm = 1.0});
    try {
      opt->enable_device_step();
      FAIL() << "clipping was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("max_norm 1"), std::string::npos) << e.what();
    }
  }
  {
    // CPU parameters (a CPU build has no graphs at all).
    auto opt = mixed_adam(model);
    try {
      GraphedTrainStep step(loss_fn, *opt);
      FAIL() << "CPU parameters were accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
    }
  }
  {
    // A plain HybridAdam on CPU tensors refuses device-step mode by name.
    optim::HybridAdam adam(model->parameters(), kAdam);
    EXPECT_THROW(adam.enable_device_step(), ConfigError);
  }
}

TEST(GraphedTrainStep, CudaReplaysMatchEagerSteps) {
  if (!cuda_here()) GTEST_SKIP() << "no CUDA device or no CUDA build";
  const at::Device cuda(at::kCUDA, 0);
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(name);
    auto eager_model = models::create_model(models::preset(name), {.seed = 4, .dtype = at::kBFloat16, .device = cuda});
    auto graph_model = models::create_model(models::preset(name), {.seed = 4, .dtype = at::kBFloat16, .device = cuda});
    auto eager_opt = mixed_adam(eager_model);
    auto graph_opt = mixed_adam(graph_model);
    GraphedTrainStep graphed([&](const at::Tensor& ids) { return graph_model->forward_loss(ids, ids); }, *graph_opt,
                             {.eager_steps = 2});
    const int steps = 12;
    for (int s = 0; s < steps; ++s) {
      const double lr = kAdam.lr * (s < 6 ? 1.0 : 0.25);  // lr changes between replays
      eager_opt->set_lr(lr);
      graph_opt->set_lr(lr);
      const at::Tensor ids = batch_at(s).to(cuda);
      at::Tensor eager_loss = eager_model->forward_loss(ids, ids);
      eager_loss.backward();
      eager_opt->step();
      eager_opt->zero_grad();
      const at::Tensor graph_loss = graphed.step(batch_at(s));  // from the host: copied in
      const double want = eager_loss.item<double>(), got = graph_loss.item<double>();
      EXPECT_LE(std::abs(got - want), 2e-3 * std::abs(want)) << "step " << s;
    }
    EXPECT_TRUE(graphed.captured());
    EXPECT_EQ(graph_opt->skipped_steps(), 0);
    EXPECT_FALSE(graph_opt->last_step_skipped());
    // The device step count reaches the saved state.
    const auto state = nlohmann::json::parse(graph_opt->state_dict().json);
    EXPECT_NE(state.dump().find(fmt::format("\"step\":{}", steps)), std::string::npos) << state.dump();
    for (const auto& item : eager_model->named_parameters()) {
      const at::Tensor a = item.value().to(at::kFloat), b = graph_model->named_parameters()[item.key()].to(at::kFloat);
      EXPECT_LE((a - b).norm().item<double>(), 2e-2 * a.norm().item<double>() + 1e-6) << item.key();
    }
    // A different batch shape is refused, naming both shapes.
    EXPECT_THROW(graphed.step(batch_at(0, 2, 32)), ConfigError);
  }
}

// Loss per step of a model trained 50 steps: fp32 on the CPU (the reference)
// or bf16 with fp32 masters (CUDA graph on a GPU, else the eager CPU step).
std::vector<double> curve(const char* name, bool bf16, bool graphed) {
  const at::Device device = graphed ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  // The fp32 CPU init, copied (rounded) into the model under test.
  const auto init = models::create_model(models::preset(name), {.seed = 9});
  auto model = models::create_model(models::preset(name),
                                    {.dtype = bf16 ? at::kBFloat16 : at::kFloat, .device = device, .init = false});
  {
    at::NoGradGuard no_grad;
    const auto source = init->named_parameters();
    for (auto& item : model->named_parameters()) item.value().copy_(source[item.key()]);
  }
  std::vector<double> losses;
  if (!bf16) {
    optim::HybridAdam adam(init->parameters(), kAdam);
    for (int s = 0; s < 50; ++s) {
      at::Tensor loss = init->forward_loss(batch_at(s), batch_at(s));
      loss.backward();
      adam.step();
      adam.zero_grad();
      losses.push_back(loss.item<double>());
    }
    return losses;
  }
  auto opt = mixed_adam(model);
  std::optional<GraphedTrainStep> step;
  if (graphed) step.emplace([&](const at::Tensor& ids) { return model->forward_loss(ids, ids); }, *opt);
  std::vector<at::Tensor> device_losses;
  for (int s = 0; s < 50; ++s) {
    if (step) {
      device_losses.push_back(step->step(batch_at(s)));
      continue;
    }
    at::Tensor loss = model->forward_loss(batch_at(s), batch_at(s));
    loss.backward();
    opt->step();
    opt->zero_grad();
    device_losses.push_back(loss.detach());
  }
  for (const auto& l : device_losses) losses.push_back(l.item<double>());
  return losses;
}

TEST(GraphedTrainStep, Bf16CurveTracksTheCpuFp32CurveOver50Steps) {
  const bool graphed = cuda_here();
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(std::string(name) + (graphed ? ", CUDA graph" : ", CPU bf16"));
    const auto fp32 = curve(name, /*bf16=*/false, /*graphed=*/false);
    const auto bf16 = curve(name, /*bf16=*/true, graphed);
    ASSERT_EQ(fp32.size(), bf16.size());
    EXPECT_LT(fp32.back(), 0.6 * fp32.front()) << "the reference does not train";
    double worst = 0;
    for (size_t i = 0; i < fp32.size(); ++i) {
      ASSERT_TRUE(std::isfinite(bf16[i])) << "step " << i;
      worst = std::max(worst, std::abs(bf16[i] - fp32[i]) / std::abs(fp32[i]));
    }
    // bf16 keeps 8 significant bits (rel. rounding 2^-9 per operation); over
    // 50 Adam steps the curves stay within a few percent of each other.
    EXPECT_LE(worst, 3e-2) << "max rel loss diff; first " << fp32.front() << " vs " << bf16.front() << ", last "
                           << fp32.back() << " vs " << bf16.back();
    std::printf("%s: max rel loss diff over 50 steps %.2e (fp32 %.4f -> %.4f, bf16 %.4f -> %.4f)\n", name, worst,
                fp32.front(), fp32.back(), bf16.front(), bf16.back());
  }
}

}  // namespace
}  // namespace colossus::amp
