// MixedPrecisionOptimizer: equals the inner optimizer run by hand on fp32
// masters (bit for bit), tracks an all-fp32 training run within bf16
// tolerance, unscales fp16 loss-scaled grads, skips steps with inf/NaN,
// clips, and resumes bit for bit.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/optim/lr_scheduler.h"
#include "colossus/optim/sgd.h"
#include "tests/optim/torch_oracle.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <limits>

namespace colossus::amp {
namespace {

using optim::AdamW;
using optim::AdamWOptions;
namespace testing = colossus::optim::testing;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<at::Tensor> random_params(at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randn({33, 8}, gen).to(dtype), at::randn({257}, gen).to(dtype), at::randn({1}, gen).to(at::kFloat)};
}

at::Tensor random_grad(const at::Tensor& like, int step, size_t i) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * step + i);
  return (at::randn(like.sizes(), gen) * 0.1).to(like.scalar_type());
}

std::unique_ptr<MixedPrecisionOptimizer> wrap_adamw(std::vector<at::Tensor> params, MixedPrecisionOptions options) {
  return std::make_unique<MixedPrecisionOptimizer>(
      std::make_unique<AdamW>(params, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1}), std::move(options));
}

// The reference: AdamW stepped on fp32 copies by hand, rounded into the model.
struct HandRun {
  std::vector<at::Tensor> masters;
  std::unique_ptr<AdamW> opt;
  explicit HandRun(const std::vector<at::Tensor>& model) {
    for (const auto& p : model) masters.push_back(p.to(at::kFloat).clone());
    opt = std::make_unique<AdamW>(masters, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  }
  void step(const std::vector<at::Tensor>& grads) {
    for (size_t i = 0; i < masters.size(); ++i) masters[i].mutable_grad() = grads[i].to(at::kFloat);
    opt->step();
  }
};

TEST(MixedPrecision, Bf16EqualsTheInnerOptimizerOnMasters) {
  auto model = random_params(at::kBFloat16, 1);
  HandRun hand(model);
  auto mp = wrap_adamw(model, {.precision = "bf16"});
  EXPECT_EQ(mp->loss_scale(), 1.0);
  for (int s = 0; s < 20; ++s) {
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < model.size(); ++i) {
      grads.push_back(random_grad(model[i], s, i));
      model[i].mutable_grad() = grads.back();
    }
    mp->step();
    hand.step(grads);
    ASSERT_FALSE(mp->last_step_skipped());
  }
  for (size_t i = 0; i < model.size(); ++i) {
    EXPECT_EQ(model[i].scalar_type(), i < 2 ? at::kBFloat16 : at::kFloat);
    EXPECT_TRUE(at::equal(mp->master_params()[i], hand.masters[i])) << "master " << i;
    EXPECT_TRUE(at::equal(model[i], hand.masters[i].to(model[i].scalar_type()))) << "model param " << i;
  }
  // The fp32 parameter is its own master: no copy.
  EXPECT_TRUE(mp->master_params()[2].is_same(model[2]));
}

// Least squares trained 20 steps in bf16 (weights and inputs) and in fp32:
// the bf16 run lands within bf16 tolerance of the fp32 one.
TEST(MixedPrecision, Bf16TrainingTracksAnFp32Run) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto x = at::randn({128, 32}, gen), w_true = at::randn({16, 32}, gen);
  const auto y = at::matmul(x, w_true.t());
  const auto w0 = at::randn({16, 32}, gen) * 0.1;
  auto w32 = w0.clone().requires_grad_(true);
  auto w16 = w0.to(at::kBFloat16).requires_grad_(true);
  AdamW fp32_opt(std::vector<at::Tensor>{w32}, {.lr = 3e-2, .weight_decay = 0.0});
  MixedPrecisionOptimizer mp(std::make_unique<AdamW>(std::vector<at::Tensor>{w16}, AdamWOptions{.lr = 3e-2, .weight_decay = 0.0}),
                             {.precision = "bf16", .max_norm = 100.0});
  const auto x16 = x.to(at::kBFloat16);
  double first_loss = 0, loss32 = 0, loss16 = 0;
  for (int s = 0; s < 20; ++s) {
    auto l32 = (at::matmul(x, w32.t()) - y).pow(2).mean();
    auto l16 = (at::matmul(x16, w16.t()).to(at::kFloat) - y).pow(2).mean();
    if (s == 0) first_loss = l32.item<double>();
    loss32 = l32.item<double>();
    loss16 = l16.item<double>();
    fp32_opt.zero_grad();
    mp.zero_grad();
    l32.backward();
    l16.backward();
    ASSERT_EQ(w16.grad().scalar_type(), at::kBFloat16);
    fp32_opt.step();
    mp.step();
  }
  EXPECT_LT(loss32, 0.7 * first_loss);  // it trains
  EXPECT_NEAR(loss16, loss32, 2e-2 * loss32);
  EXPECT_LE(testing::max_rel_diff(w16.detach().to(at::kFloat), w32.detach()), 2e-2);
  EXPECT_LE(testing::max_rel_diff(mp.master_params()[0], w32.detach()), 2e-2);
  EXPECT_FALSE(std::isnan(mp.last_grad_norm()));
}

// fp16: backward on the scaled loss, unscaled in the masters; scaling by a
// power of two is exact, so this equals the unscaled hand run bit for bit.
TEST(MixedPrecision, Fp16UnscalesLossScaledGrads) {
  auto model = random_params(at::kHalf, 4);
  HandRun hand(model);
  for (auto& p : model) p.requires_grad_(true);
  auto mp = wrap_adamw(model, {.precision = "fp16", .loss_scaler = {.initial_scale = 1024}});
  for (int s = 0; s < 10; ++s) {
    std::vector<at::Tensor> grads;
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (size_t i = 0; i < model.size(); ++i) {
      grads.push_back(random_grad(model[i], s, i));
      loss = loss + (model[i].to(at::kFloat) * grads.back().to(at::kFloat)).sum();  // d loss / d p = grad
    }
    mp->zero_grad();
    mp->scale_loss(loss).backward();
    EXPECT_TRUE(at::equal(model[0].grad(), grads[0] * 1024));
    mp->step();
    hand.step(grads);
  }
  for (size_t i = 0; i < model.size(); ++i) EXPECT_TRUE(at::equal(mp->master_params()[i], hand.masters[i])) << i;
}

TEST(MixedPrecision, SkipsStepsWithInfOrNanAndBacksOffAfterHysteresis) {
  auto model = random_params(at::kHalf, 5);
  auto mp = wrap_adamw(model, {.precision = "fp16", .loss_scaler = {.initial_scale = 256, .hysteresis = 2}});
  auto feed = [&](int s, bool poison) {
    for (size_t i = 0; i < model.size(); ++i) model[i].mutable_grad() = random_grad(model[i], s, i) * 256;
    if (poison) model[1].mutable_grad()[17] = kInf;
  };
  feed(0, false);
  mp->step();
  ASSERT_FALSE(mp->last_step_skipped());
  std::vector<at::Tensor> before;
  for (const auto& p : model) before.push_back(p.clone());
  const auto masters_before = mp->master_params()[0].clone();
  const auto inner_before = mp->inner().state_dict().json;
  feed(1, true);
  mp->step();
  EXPECT_TRUE(mp->last_step_skipped());
  EXPECT_EQ(mp->skipped_steps(), 1);
  EXPECT_EQ(mp->loss_scale(), 256);  // first overflow: within hysteresis
  for (size_t i = 0; i < model.size(); ++i) EXPECT_TRUE(at::equal(model[i], before[i])) << i;
  EXPECT_TRUE(at::equal(mp->master_params()[0], masters_before));
  EXPECT_EQ(mp->inner().state_dict().json, inner_before);  // step counts unchanged
  feed(2, true);
  mp->step();
  EXPECT_EQ(mp->loss_scale(), 128);  // second: backoff
  feed(3, false);
  mp->step();
  EXPECT_FALSE(mp->last_step_skipped());
  EXPECT_FALSE(at::equal(model[0], before[0]));
  // bf16: no scaling, but a NaN still skips.
  auto bf = random_params(at::kBFloat16, 6);
  auto mp_bf = wrap_adamw(bf, {.precision = "bf16"});
  for (size_t i = 0; i < bf.size(); ++i) bf[i].mutable_grad() = random_grad(bf[i], 0, i);
  bf[2].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  const auto bf_before = bf[0].clone();
  mp_bf->step();
  EXPECT_TRUE(mp_bf->last_step_skipped());
  EXPECT_TRUE(at::equal(bf[0], bf_before));
  EXPECT_EQ(mp_bf->loss_scale(), 1.0);
}

TEST(MixedPrecision, ClipsMasterGradsByGlobalNorm) {
  auto model = random_params(at::kBFloat16, 7);
  HandRun hand(model);
  auto mp = wrap_adamw(model, {.precision = "bf16", .max_norm = 0.5});
  for (int s = 0; s < 5; ++s) {
    std::vector<at::Tensor> grads, ref_grads;
    for (size_t i = 0; i < model.size(); ++i) {
      grads.push_back(random_grad(model[i], s, i) * 10);
      model[i].mutable_grad() = grads.back();
      ref_grads.push_back(grads.back().to(at::kFloat).clone());  // fp32 grads are clipped in place
    }
    mp->step();
    const double norm = clip_grad_norm(ref_grads, 0.5);
    EXPECT_DOUBLE_EQ(mp->last_grad_norm(), norm);
    EXPECT_GT(norm, 0.5);
    hand.step(ref_grads);
  }
  for (size_t i = 0; i < model.size(); ++i) EXPECT_TRUE(at::equal(mp->master_params()[i], hand.masters[i])) << i;
}

TEST(MixedPrecision, HooksAndSchedulersReachTheInnerOptimizer) {
  auto model = random_params(at::kBFloat16, 8);
  int calls = 0;
  auto mp = wrap_adamw(model, {.precision = "bf16", .overflow_reducer = [&](bool local) {
                                 ++calls;
                                 EXPECT_FALSE(local);
                                 return true;  // another rank overflowed
                               }});
  for (size_t i = 0; i < model.size(); ++i) model[i].mutable_grad() = random_grad(model[i], 0, i);
  const auto before = model[0].clone();
  mp->step();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(mp->last_step_skipped());
  EXPECT_TRUE(at::equal(model[0], before));
  optim::LinearWarmupDecayLR sched(*mp, {.warmup_steps = 2, .total_steps = 10});
  sched.step();
  EXPECT_DOUBLE_EQ(mp->param_groups()[0].lr, 5e-3);
  auto mp2 = wrap_adamw(random_params(at::kBFloat16, 8), {.precision = "bf16"});
  mp2->set_lr(0.125);
  for (auto& p : mp2->param_groups()[0].params) p.mutable_grad() = at::zeros_like(p);
  mp2->step();
  EXPECT_EQ(mp2->inner().param_groups()[0].lr, 0.125);
}

TEST(MixedPrecision, ResumesBitForBit) {
  auto model = random_params(at::kHalf, 9);
  auto mp = wrap_adamw(model, {.precision = "fp16", .loss_scaler = {.initial_scale = 512, .growth_interval = 3}});
  auto feed = [](std::vector<at::Tensor>& params, int s) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = random_grad(params[i], s, i) * 128;
    if (s == 2) params[0].mutable_grad()[0][0] = kInf;
  };
  for (int s = 0; s < 5; ++s) {
    feed(model, s);
    mp->step();
  }
  auto state = mp->state_dict();
  const auto path = (testing::scratch_dir() / "mixed_precision.safetensors").string();
  checkpoint::save_safetensors(path, state.tensors, {{"optimizer", state.json}});
  auto file = checkpoint::SafetensorsFile::open(path);
  optim::OptimizerState loaded{{}, file.metadata().at("optimizer")};
  for (const auto& key : file.keys()) loaded.tensors.emplace_back(key, file.get(key).clone());
  std::vector<at::Tensor> model2;
  for (const auto& p : model) model2.push_back(p.detach().clone());
  auto mp2 = wrap_adamw(model2, {.precision = "fp16", .loss_scaler = {.initial_scale = 512, .growth_interval = 3}});
  mp2->load_state_dict(loaded);
  EXPECT_EQ(mp2->loss_scale(), mp->loss_scale());
  for (int s = 5; s < 12; ++s) {
    feed(model, s);
    feed(model2, s);
    mp->step();
    mp2->step();
  }
  for (size_t i = 0; i < model.size(); ++i) {
    EXPECT_TRUE(at::equal(model[i], model2[i])) << i;
    EXPECT_TRUE(at::equal(mp->master_params()[i], mp2->master_params()[i])) << i;
  }
  EXPECT_EQ(mp->loss_scale(), mp2->loss_scale());
  // A bf16 wrapper refuses an fp16 state (it has a loss scaler).
  auto bf = wrap_adamw(random_params(at::kBFloat16, 9), {.precision = "bf16"});
  EXPECT_THROW(bf->load_state_dict(loaded), CheckpointError);
}

TEST(MixedPrecision, InvalidSetupsAreConfigErrors) {
  EXPECT_THROW(wrap_adamw(random_params(at::kBFloat16, 1), {.precision = "fp8"}), ConfigError);
  EXPECT_THROW(wrap_adamw(random_params(at::kHalf, 1), {.precision = "bf16"}), ConfigError);
  EXPECT_THROW(wrap_adamw(random_params(at::kBFloat16, 1), {.precision = "bf16", .max_norm = -1}), ConfigError);
  EXPECT_THROW(MixedPrecisionOptimizer(nullptr, {}), ConfigError);
  auto params = random_params(at::kFloat, 1);
  auto stepped = std::make_unique<AdamW>(params);
  for (auto& p : params) p.mutable_grad() = at::ones_like(p);
  stepped->step();
  EXPECT_THROW(MixedPrecisionOptimizer(std::move(stepped), {}), ConfigError);
}

// bf16 model parameters on CUDA with HybridAdam: the one-pass step (the
// inner optimizer reads the bf16 grads and writes the bf16 params) equals
// the copy path on the CPU bit for bit (both equal the Adam reference on
// float(grad)), skips a NaN step the same way, and leaves the masters'
// gradients unset (so the copy path provably did not run).
TEST(MixedPrecision, FusedCudaStepEqualsTheCopyPathBitForBit) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const optim::HybridAdamOptions adam{.lr = 1e-2, .betas = {0.9, 0.95}, .weight_decay = 0.1, .adamw_mode = true};
  auto host = random_params(at::kBFloat16, 9);
  host.pop_back();  // every parameter bf16: the fused path's condition
  std::vector<at::Tensor> device, counted;
  for (const auto& p : host) {
    device.push_back(p.cuda());
    counted.push_back(p.cuda());
  }
  MixedPrecisionOptimizer cpu(std::make_unique<optim::HybridAdam>(host, adam), {.precision = "bf16"});
  MixedPrecisionOptimizer gpu(std::make_unique<optim::HybridAdam>(device, adam), {.precision = "bf16"});
  // Device-step mode (the CUDA-graph form): lr and the step count on the
  // device, the skip decided there; same bits.
  MixedPrecisionOptimizer on_device(std::make_unique<optim::HybridAdam>(counted, adam), {.precision = "bf16"});
  on_device.enable_device_step();
  for (int step = 0; step < 5; ++step) {
    const double lr = step < 3 ? 1e-2 : 4e-3;
    for (auto* opt : {&cpu, &gpu, &on_device}) opt->set_lr(lr);
    on_device.prepare_device_step();
    for (size_t i = 0; i < host.size(); ++i) {
      host[i].mutable_grad() = random_grad(host[i], step, i);
      device[i].mutable_grad() = host[i].grad().cuda();
      counted[i].mutable_grad() = host[i].grad().cuda();
    }
    if (step == 2) {
      host[1].mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
      device[1].mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
      counted[1].mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
    }
    cpu.step();
    gpu.step();
    on_device.step();
    ASSERT_EQ(gpu.last_step_skipped(), step == 2) << "step " << step;
    ASSERT_EQ(cpu.last_step_skipped(), step == 2) << "step " << step;
    ASSERT_EQ(on_device.last_step_skipped(), step == 2) << "step " << step;
    for (size_t i = 0; i < host.size(); ++i) {
      ASSERT_TRUE(at::equal(device[i].cpu(), host[i])) << "step " << step << " param " << i;
      ASSERT_TRUE(at::equal(counted[i].cpu(), host[i])) << "device-step mode, step " << step << " param " << i;
      ASSERT_TRUE(at::equal(gpu.master_params()[i].cpu(), cpu.master_params()[i])) << "step " << step << " master " << i;
      ASSERT_TRUE(at::equal(on_device.master_params()[i].cpu(), cpu.master_params()[i]))
          << "device-step mode, step " << step << " master " << i;
      EXPECT_FALSE(gpu.master_params()[i].grad().defined()) << "the copy path ran for param " << i;
    }
  }
  EXPECT_EQ(gpu.skipped_steps(), 1);
  EXPECT_EQ(on_device.skipped_steps(), 1);
  // The device step count (4 taken, 1 skipped) reaches the saved state, which
  // the host-counted optimizer loads and agrees with.
  EXPECT_EQ(on_device.state_dict().json, gpu.state_dict().json);
}

}  // namespace
}  // namespace colossus::amp
