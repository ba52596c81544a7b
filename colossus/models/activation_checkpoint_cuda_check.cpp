// CUDA builds only (in the colossus_cuda bundle): the `colossus check`
// self-test that activation checkpointing replays the GPU's random draws. A
// GPT-2 of 3 blocks with every dropout at 0.1, on CUDA in fp32, trains one
// step with and without checkpointing from the same weights and the same
// CUDA seed: the loss and every gradient must agree to fp32 rounding (the
// recomputed blocks draw the forward's dropout masks again). A third run from
// another seed must differ, or dropout was not on and the check proves
// nothing.
#include "colossus/kernels/registry.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/pretrained.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>

#include <string>
#include <vector>

namespace colossus::models {

namespace {

struct Step {
  double loss = 0;
  std::vector<at::Tensor> grads;
};

Step train_step(bool checkpointed, uint64_t cuda_seed) {
  GPT2Config config;
  config.vocab_size = 96, config.n_positions = 64, config.n_embd = 64, config.n_layer = 3, config.n_head = 4;
  auto model = create_model(config, {.seed = 5, .dtype = at::kFloat, .device = at::Device(at::kCUDA, 0)});
  model->train();
  if (checkpointed && enable_activation_checkpointing(*model, 1.0) != 3) throw std::runtime_error("3 blocks expected");
  at::Generator generator = at::globalContext().defaultGenerator(at::Device(at::kCUDA, 0));  // a handle
  generator.set_current_seed(cuda_seed);
  const at::Tensor ids = at::arange(2 * 48, at::TensorOptions().dtype(at::kLong)).remainder(96).view({2, 48}).cuda();
  const at::Tensor loss = causal_lm_loss(model->forward(ids), ids);
  loss.backward();
  Step step{.loss = loss.item<double>()};
  for (const auto& p : model->parameters()) step.grads.push_back(p.grad().defined() ? p.grad().cpu() : at::Tensor());
  return step;
}

double max_grad_diff(const Step& a, const Step& b) {
  double worst = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    if (!a.grads[i].defined() || !b.grads[i].defined()) continue;
    const double scale = std::max(a.grads[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a.grads[i] - b.grads[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

std::string check_activation_checkpoint_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  const Step plain = train_step(false, 123), checkpointed = train_step(true, 123), other = train_step(false, 456);
  const double same = max_grad_diff(plain, checkpointed), different = max_grad_diff(plain, other);
  if (!(std::abs(plain.loss - checkpointed.loss) <= 1e-6 * std::abs(plain.loss)) || !(same <= 1e-5)) {
    return fmt::format("checkpointed step differs: loss {:.8f} vs {:.8f}, max relative gradient difference {:.2e}",
                       checkpointed.loss, plain.loss, same);
  }
  if (!(different > 1e-3)) {
    return fmt::format("another CUDA seed gave the same gradients (max diff {:.2e}): dropout was not exercised", different);
  }
  return {};
}

[[maybe_unused]] const bool registered = [] {
  kernels::register_kernel({"activation_checkpoint_rng", "cuda", check_activation_checkpoint_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::models
