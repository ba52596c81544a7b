// Activation checkpointing: wrapped blocks keep HF names, give the same loss
// and gradients as the plain model (GPT-2 with dropout: the rerun replays the
// RNG; LLaMA), train on the same 20-step curve, and lower the measured peak
// of CPU memory allocated between forward and backward (a counting allocator
// installed as torch's CPU allocator).
#include "colossus/core/errors.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

using namespace colossus;
using namespace colossus::models;

namespace {

// Passes allocations to the default CPU allocator and tracks live and peak bytes.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t bytes) override {
    auto* record = new Record{base_->allocate(bytes), bytes, this};
    live_ += static_cast<int64_t>(bytes);
    peak_ = std::max(peak_.load(), live_.load());
    void* data = record->inner.get();
    return {data, record, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  void reset_peak() { peak_ = live_.load(); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  struct Record {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
  };
  static void release(void* ctx) {
    auto* record = static_cast<Record*>(ctx);
    record->owner->live_ -= static_cast<int64_t>(record->bytes);
    delete record;
  }
  c10::Allocator* base_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

CountingAllocator& counting_allocator() {
  static CountingAllocator* allocator = [] {
    auto* a = new CountingAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *allocator;
}

ModelConfig gpt2_config(double dropout) {
  GPT2Config c;
  c.vocab_size = 96;
  c.n_positions = 64;
  c.n_embd = 64;
  c.n_layer = 4;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = dropout;
  return c;
}

ModelConfig llama_config() {
  LlamaConfig c;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  return c;
}

at::Tensor batch(int64_t step, int64_t rows = 8, int64_t seq_len = 64) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + static_cast<uint64_t>(step));
  return at::randint(96, {rows, seq_len}, gen, at::kLong);
}

// Loss and gradients of one step, with the CPU RNG seeded (dropout).
std::pair<double, std::vector<at::Tensor>> step_grads(CausalLM& model, const at::Tensor& ids,
                                                      const TokenLayout& layout = {}) {
  at::manual_seed(11);
  auto loss = model.loss(model.forward(ids, layout), ids);
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
  model.zero_grad();
  return {loss.item<double>(), grads};
}

}  // namespace

TEST(ActivationCheckpoint, SameLossAndGradientsAndNames) {
  for (const auto& config : {gpt2_config(0.1), llama_config()}) {
    auto plain = create_model(config, {.seed = 3});
    auto wrapped = create_model(config, {.seed = 3});
    std::vector<std::string> names;
    for (const auto& item : wrapped->named_parameters()) names.push_back(item.key());
    EXPECT_EQ(enable_activation_checkpointing(*wrapped, 1.0), 4);
    std::vector<std::string> after;
    for (const auto& item : wrapped->named_parameters()) after.push_back(item.key());
    EXPECT_EQ(after, names);
    const auto ids = batch(0);
    // Plain rows, and packed rows (the rerun in backward needs the layout's
    // positions and document mask too).
    const std::vector<std::vector<int64_t>> documents(8, std::vector<int64_t>{30, 20, 14});
    for (const TokenLayout& layout : {TokenLayout{}, TokenLayout::packed(documents, 64)}) {
      const auto [loss_a, grads_a] = step_grads(*plain, ids, layout);
      const auto [loss_b, grads_b] = step_grads(*wrapped, ids, layout);
      EXPECT_DOUBLE_EQ(loss_a, loss_b) << model_type(config);
      for (size_t i = 0; i < grads_a.size(); ++i) {
        EXPECT_TRUE(at::allclose(grads_a[i], grads_b[i], 1e-5, 1e-7)) << model_type(config) << " grad " << names[i];
      }
    }
  }
  auto model = create_model(llama_config(), {.seed = 3});
  EXPECT_THROW(enable_activation_checkpointing(*model, 1.5), ConfigError);
  EXPECT_EQ(enable_activation_checkpointing(*model, 0.5), 2);
}

// Selective checkpointing (granularity mlp): only each block's MLP reruns in
// backward; the loss and every gradient are those of the plain model (GPT-2
// with dropout in its MLP: the rerun replays the masks), names unchanged.
TEST(ActivationCheckpoint, MlpGranularitySameLossAndGradients) {
  for (const auto& config : {gpt2_config(0.1), llama_config()}) {
    auto plain = create_model(config, {.seed = 3});
    auto selective = create_model(config, {.seed = 3});
    std::vector<std::string> names;
    for (const auto& item : selective->named_parameters()) names.push_back(item.key());
    EXPECT_EQ(enable_activation_checkpointing(*selective, 0.75, CheckpointGranularity::Mlp), 3);
    std::vector<std::string> after;
    for (const auto& item : selective->named_parameters()) after.push_back(item.key());
    EXPECT_EQ(after, names);
    const auto ids = batch(0);
    const auto [loss_a, grads_a] = step_grads(*plain, ids);
    const auto [loss_b, grads_b] = step_grads(*selective, ids);
    EXPECT_DOUBLE_EQ(loss_a, loss_b) << model_type(config);
    for (size_t i = 0; i < grads_a.size(); ++i) {
      EXPECT_TRUE(at::allclose(grads_a[i], grads_b[i], 1e-5, 1e-7)) << model_type(config) << " grad " << names[i];
    }
  }
  EXPECT_EQ(parse_checkpoint_granularity("mlp"), CheckpointGranularity::Mlp);
  EXPECT_EQ(parse_checkpoint_granularity("full"), CheckpointGranularity::Full);
  EXPECT_THROW(parse_checkpoint_granularity("selective"), ConfigError);
  // A mixture-of-experts block has no dense MLP to rerun: refused by name.
  auto moe = create_model(preset("mixtral-tiny"), {.seed = 3});
  EXPECT_THROW(enable_activation_checkpointing(*moe, 1.0, CheckpointGranularity::Mlp), ConfigError);
}

// Peak step memory: plain > mlp granularity > full, on the same loss curve.
TEST(ActivationCheckpoint, SameCurveLowerPeakMemory) {
  auto& allocator = counting_allocator();
  std::vector<double> curves[3];
  int64_t peaks[3] = {0, 0, 0};
  for (int checkpointed = 0; checkpointed < 3; ++checkpointed) {
    auto model = create_model(llama_config(), {.seed = 3});
    if (checkpointed == 1) enable_activation_checkpointing(*model);
    if (checkpointed == 2) enable_activation_checkpointing(*model, 1.0, CheckpointGranularity::Mlp);
    optim::AdamW optimizer(model->parameters(), optim::AdamWOptions{.lr = 3e-3});
    for (int64_t step = 0; step < 20; ++step) {
      const auto ids = batch(step, 4, 32);
      const int64_t before = allocator.live();
      allocator.reset_peak();
      auto loss = model->loss(model->forward(ids), ids);
      loss.backward();
      peaks[checkpointed] = std::max(peaks[checkpointed], allocator.peak() - before);
      optimizer.step();
      optimizer.zero_grad();
      curves[checkpointed].push_back(loss.item<double>());
    }
  }
  for (size_t i = 0; i < curves[0].size(); ++i) {
    EXPECT_NEAR(curves[1][i], curves[0][i], 1e-5 * curves[0][i]);
    EXPECT_NEAR(curves[2][i], curves[0][i], 1e-5 * curves[0][i]);
  }
  EXPECT_LT(peaks[1], peaks[0] * 3 / 4);
  EXPECT_LT(peaks[2], peaks[0] * 9 / 10);
  EXPECT_GT(peaks[2], peaks[1]);
  std::printf("llama 4 layers, batch 4 x 32: peak step memory %.2f MB plain, %.2f MB checkpointed, %.2f MB MLP "
              "checkpointed; loss %.5f -> %.5f\n",
              static_cast<double>(peaks[0]) / 1e6, static_cast<double>(peaks[1]) / 1e6,
              static_cast<double>(peaks[2]) / 1e6, curves[1].front(), curves[1].back());
}
