#include "tests/booster/booster_testing.h"

#include "colossus/amp/clip_grad.h"
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/lr_scheduler.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>

#include <functional>
#include <random>

namespace colossus::booster::testing {

namespace ct = colossus::testing;

namespace {

constexpr uint64_t kModelSeed = 7;

std::unique_ptr<optim::Optimizer> make_optimizer(models::CausalLM& model) {
  return std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
}

std::shared_ptr<optim::LRScheduler> make_scheduler(optim::Optimizer& optimizer) {
  return std::make_shared<optim::CosineWarmupLR>(optimizer,
                                                 optim::CosineLROptions{.warmup_steps = 4, .total_steps = kSteps});
}

}  // namespace

models::ModelConfig tiny_gpt2() {
  models::GPT2Config c;
  c.vocab_size = 96;
  c.n_positions = 32;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
  return c;
}

models::ModelConfig tiny_llama() {
  models::LlamaConfig c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  return c;
}

models::ModelConfig tiny_family(const char* preset) {
  auto c = std::get<models::LlamaConfig>(models::preset(preset));
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  return c;
}

models::ModelConfig tiny_phi3() {
  auto c = std::get<models::LlamaConfig>(tiny_family("phi3-tiny"));
  c.rope_scaling.short_factor = {1.0, 1.2, 1.6, 2.5};
  c.rope_scaling.long_factor = {1.0, 2.0, 4.0, 8.0};
  c.rope_scaling.original_max_position_embeddings = 8;
  return c;
}

at::Tensor global_batch(const models::ModelConfig& config, int64_t step) {
  // Learnable rows (an arithmetic sequence mod V from a random start and
  // stride), so the loss falls fast and a diverging run would show.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + static_cast<uint64_t>(step));
  const int64_t vocab = models::vocab_size(config);
  auto start = at::randint(vocab, {kGlobalBatch, 1}, gen, at::kLong);
  auto stride = at::randint(1, 4, {kGlobalBatch, 1}, gen, at::kLong);
  return (start + stride * at::arange(kSeqLen, at::kLong).unsqueeze(0)).remainder(vocab);
}

namespace {

// The single-process fp32 run; loss_of gives a step's loss on its global batch.
std::vector<double> run_reference(const models::ModelConfig& config, int64_t steps, double max_norm,
                                  const std::function<at::Tensor(models::CausalLM&, const at::Tensor&)>& loss_of) {
  auto model = models::create_model(config, {.seed = kModelSeed});
  auto optimizer = make_optimizer(*model);
  auto scheduler = make_scheduler(*optimizer);
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    auto loss = loss_of(*model, global_batch(config, step));
    loss.backward();
    if (max_norm > 0.0) {
      std::vector<at::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad());
      at::NoGradGuard no_grad;
      amp::clip_grad_norm(grads, max_norm);
    }
    optimizer->step();
    scheduler->step();
    optimizer->zero_grad();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace

std::vector<double> reference_losses(const models::ModelConfig& config, int64_t steps, double max_norm) {
  return run_reference(config, steps, max_norm,
                       [](models::CausalLM& model, const at::Tensor& ids) { return model.loss(model.forward(ids), ids); });
}

models::TokenLayout packed_layout(int64_t rows) {
  return models::TokenLayout::packed(std::vector<std::vector<int64_t>>(static_cast<size_t>(rows), {5, 7}), kSeqLen);
}

at::Tensor packed_labels(const at::Tensor& ids) {
  at::Tensor labels = ids.clone();
  labels.narrow(1, 5, 1).fill_(-100);
  labels.narrow(1, 12, kSeqLen - 12).fill_(-100);
  return labels;
}

std::vector<double> reference_losses_packed(const models::ModelConfig& config, int64_t steps) {
  return run_reference(config, steps, /*max_norm=*/0.0, [](models::CausalLM& model, const at::Tensor& ids) {
    return model.loss(model.forward(ids, packed_layout(ids.size(0))), packed_labels(ids));
  });
}

std::vector<double> reference_losses_bf16(const models::ModelConfig& config, int64_t steps) {
  auto model = models::create_model(config, {.seed = kModelSeed});
  std::vector<at::Tensor> originals;
  {
    at::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      originals.push_back(p.detach().clone());
      p.set_data(p.detach().to(at::kBFloat16));
    }
    for (auto& b : model->buffers()) {
      if (at::isFloatingType(b.scalar_type())) b.set_data(b.detach().to(at::kBFloat16));
    }
  }
  auto optimizer = std::make_unique<amp::MixedPrecisionOptimizer>(make_optimizer(*model),
                                                                   amp::MixedPrecisionOptions{.precision = "bf16"});
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < originals.size(); ++i) optimizer->master_params()[i].copy_(originals[i]);
  }
  auto scheduler = make_scheduler(*optimizer);
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    auto ids = global_batch(config, step);
    auto loss = model->loss(model->forward(ids), ids);
    loss.backward();
    optimizer->step();
    scheduler->step();
    optimizer->zero_grad();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

BoostedRun::BoostedRun(const models::ModelConfig& config, BoosterOptions options, int micro_batches)
    : config_(config), micro_batches_(micro_batches) {
  booster_ =
      std::make_unique<Booster>(std::make_shared<DDPPlugin>(DDPPluginOptions{}, ct::world()), std::move(options));
  auto model = models::create_model(config, {.seed = kModelSeed});
  auto optimizer = make_optimizer(*model);
  auto scheduler = make_scheduler(*optimizer);
  boosted_ = booster_->boost(model, std::move(optimizer), scheduler);
}

double BoostedRun::train_step(int64_t step) {
  auto world = ct::world();
  const int64_t rows = kGlobalBatch / world->size();
  auto local = global_batch(config_, step).narrow(0, world->rank() * rows, rows);
  auto micro = local.chunk(micro_batches_, 0);
  auto& model = *boosted_.model;
  double local_loss = 0.0;
  for (size_t m = 0; m < micro.size(); ++m) {
    auto run = [&] {
      auto ids = micro[m];
      auto loss = model.unwrap().loss(model.forward(ids), ids) / static_cast<double>(micro.size());
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
  world->all_reduce(total).wait();
  return total.item<double>() / world->size();
}

std::vector<double> BoostedRun::train(int64_t first_step, int64_t end_step) {
  std::vector<double> losses;
  for (int64_t step = first_step; step < end_step; ++step) losses.push_back(train_step(step));
  return losses;
}

SharedScratch::SharedScratch(const std::string& tag) {
  auto world = ct::world();
  auto token = at::zeros({1}, at::kLong);
  if (world->rank() == 0) token.fill_(static_cast<int64_t>(std::random_device{}() & 0x7fffffff));
  world->broadcast(token, 0).wait();
  dir_ = std::filesystem::temp_directory_path() /
         ("colossus_booster_" + tag + "_" + std::to_string(token.item<int64_t>()));
  if (world->rank() == 0) std::filesystem::create_directories(dir_);
  barrier();
}

SharedScratch::~SharedScratch() {
  barrier();
  std::error_code ec;
  if (ct::world()->rank() == 0) std::filesystem::remove_all(dir_, ec);
}

void barrier() { ct::world()->barrier().wait(); }

}  // namespace colossus::booster::testing
