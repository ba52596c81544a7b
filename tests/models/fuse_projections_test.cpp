// LLaMA's inference-time merged projections (q/k/v, gate/up) and the signed
// RoPE form give the same logits as the plain model, keep the parameters
// (same objects, same values, no extra memory) and leave training untouched.
#include "colossus/models/llama.h"
#include "colossus/models/pretrained.h"
#include "colossus/models/rope.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace colossus::models {
namespace {

LlamaConfig small_llama() {
  return {.vocab_size = 64, .hidden_size = 32, .intermediate_size = 48, .num_hidden_layers = 2,
          .num_attention_heads = 4, .num_key_value_heads = 2, .max_position_embeddings = 64,
          .initializer_range = 0.2, .attention_bias = true};
}

TEST(FuseProjections, SameLogitsSameParametersNoExtraMemory) {
  auto model = create_model(small_llama(), {.seed = 3});
  model->eval();
  at::Tensor ids = at::randint(0, 64, {2, 9}, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor before = model->forward(ids);
  std::vector<at::Tensor> params = model->parameters();
  std::vector<at::Tensor> values;
  for (const auto& p : params) values.push_back(p.clone());
  model->fuse_projections();
  const at::Tensor after = model->forward(ids);
  EXPECT_TRUE(at::allclose(after, before, 1e-5, 1e-5)) << (after - before).abs().max().item<float>();
  const std::vector<at::Tensor> fused_params = model->parameters();
  ASSERT_EQ(fused_params.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(fused_params[i].is_same(params[i])) << "parameter " << i << " was replaced";
    EXPECT_TRUE(at::equal(fused_params[i], values[i])) << "parameter " << i << " changed";
  }
  // q_proj's weight is now a view into the merged tensor, not a copy.
  auto& layer = dynamic_cast<LlamaDecoderLayer&>(*model->blocks()[0]);
  auto& q = layer.self_attn().layer_as<Linear>("q_proj");
  auto& k = layer.self_attn().layer_as<Linear>("k_proj");
  EXPECT_EQ(static_cast<const char*>(k.weight.data_ptr()),
            static_cast<const char*>(q.weight.data_ptr()) + q.weight.numel() * q.weight.element_size());
}

TEST(FuseProjections, TrainingStillUsesAndUpdatesTheSameWeights) {
  auto model = create_model(small_llama(), {.seed = 4});
  model->fuse_projections();
  model->train();
  at::Tensor ids = at::randint(0, 64, {2, 9}, at::kLong);
  at::Tensor loss = model->loss(model->forward(ids), ids);
  loss.backward();
  auto& layer = dynamic_cast<LlamaDecoderLayer&>(*model->blocks()[1]);
  auto& v = layer.self_attn().layer_as<Linear>("v_proj");
  ASSERT_TRUE(v.weight.grad().defined());
  EXPECT_GT(v.weight.grad().abs().sum().item<double>(), 0.0);
}

TEST(Rope, SignedFormEqualsTheRotateHalfForm) {
  at::Tensor x = at::randn({2, 3, 5, 8});
  at::Tensor angles = at::randn({5, 8});
  at::Tensor cos = angles.cos(), sin = angles.sin();
  EXPECT_TRUE(at::allclose(apply_rope_signed(x, cos, signed_rope_sin(sin)), apply_rope(x, cos, sin), 1e-6, 1e-6));
}

}  // namespace
}  // namespace colossus::models
