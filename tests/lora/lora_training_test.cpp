// A few plain SGD steps on a LoRA model: the loss falls, only the adapters
// move, and the base weights (frozen by apply_lora) stay bit-identical.
#include "colossus/lora/inject.h"
#include "tests/lora/lora_testing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace colossus::lora {
namespace {

TEST(LoraTraining, SgdStepsMoveOnlyTheAdapters) {
  auto model = testing::tiny_llama(11);
  apply_lora(*model, {.r = 4, .lora_alpha = 8, .target_modules = {"all-linear"}}, /*seed=*/2);
  std::map<std::string, at::Tensor> before;
  for (const auto& item : model->named_parameters()) before[item.key()] = item.value().detach().clone();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor ids = at::randint(64, {2, 16}, generator, at::kLong);

  double first_loss = 0.0, last_loss = 0.0;
  for (int step = 0; step < 5; ++step) {
    const at::Tensor loss = model->loss(model->forward(ids), ids);
    (step == 0 ? first_loss : last_loss) = loss.item<double>();
    loss.backward();
    at::NoGradGuard no_grad;
    for (auto& [key, param] : lora_parameters(*model)) {
      param.sub_(param.grad() * 0.5);
      param.mutable_grad().zero_();
    }
  }
  EXPECT_LT(last_loss, first_loss);
  for (const auto& item : model->named_parameters()) {
    const bool adapter = item.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(at::equal(item.value(), before.at(item.key())), !adapter) << item.key();
    if (!adapter) {
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
    }
  }
}

}  // namespace
}  // namespace colossus::lora
