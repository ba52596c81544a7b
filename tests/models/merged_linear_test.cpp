// Training's merged projections (merged_linear.h): one matmul each way for
// q/k/v and gate/up gives the separate layers' outputs and parameter
// gradients, with the weights adjacent (read in place) or not (copied), and
// LLaMA falls back to the separate layers where one is not a plain Linear.
#include "colossus/models/fp8_linear.h"
#include "colossus/models/llama.h"
#include "colossus/models/merged_linear.h"
#include "colossus/models/pretrained.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace colossus::models {
namespace {

// Largest |a - b| over the largest |b| (0 where both are zero).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.detach().to(at::kDouble), b64 = b.detach().to(at::kDouble);
  return (a64 - b64).abs().max().item<double>() / std::max(b64.abs().max().item<double>(), 1e-30);
}

struct Case {
  at::Tensor x;
  std::vector<at::Tensor> weights, biases;
};

// x (2, 5, 16); q (8, 16), k and v (4, 16) as GQA has them.
Case make_case(at::ScalarType dtype, bool adjacent, bool with_bias) {
  at::manual_seed(11);
  const auto options = at::TensorOptions().dtype(dtype);
  Case c;
  c.x = at::randn({2, 5, 16}, options).requires_grad_(true);
  const std::vector<int64_t> rows{8, 4, 4};
  for (int64_t r : rows) {
    c.weights.push_back(at::randn({r, 16}, options) * 0.3);
    if (with_bias) c.biases.push_back(at::randn({r}, options));
  }
  if (adjacent) {
    pack_rows(c.weights);
    if (with_bias) pack_rows(c.biases);
  }
  for (auto& t : c.weights) t.requires_grad_(true);
  for (auto& t : c.biases) t.requires_grad_(true);
  return c;
}

void expect_merged_equals_separate(at::ScalarType dtype, bool adjacent, bool with_bias, double tolerance) {
  Case merged = make_case(dtype, adjacent, with_bias), separate = make_case(dtype, adjacent, with_bias);
  EXPECT_EQ(rows_adjacent(merged.weights), adjacent);
  const at::Tensor y = merged_linear(merged.x, merged.weights, merged.biases);
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < separate.weights.size(); ++i) {
    parts.push_back(at::linear(separate.x, separate.weights[i], with_bias ? separate.biases[i] : at::Tensor()));
  }
  const at::Tensor y_ref = at::cat(parts, -1);
  ASSERT_EQ(y.sizes(), y_ref.sizes());
  EXPECT_LE(rel_diff(y, y_ref), tolerance);
  // An uneven upstream gradient, through split views as LLaMA uses them.
  const at::Tensor dy = at::randn(y.sizes(), y.options());
  const auto views = y.split_with_sizes({8, 4, 4}, -1);
  (at::cat(views, -1) * dy).sum().backward();
  (y_ref * dy).sum().backward();
  EXPECT_LE(rel_diff(merged.x.grad(), separate.x.grad()), tolerance);
  for (size_t i = 0; i < merged.weights.size(); ++i) {
    EXPECT_LE(rel_diff(merged.weights[i].grad(), separate.weights[i].grad()), tolerance) << "weight " << i;
    if (with_bias) {
      EXPECT_LE(rel_diff(merged.biases[i].grad(), separate.biases[i].grad()), tolerance) << "bias " << i;
    }
  }
}

TEST(MergedLinear, Fp32AdjacentWeightsEqualTheSeparateLayers) {
  expect_merged_equals_separate(at::kFloat, true, false, 1e-5);
  expect_merged_equals_separate(at::kFloat, true, true, 1e-5);
}

TEST(MergedLinear, Fp32CopiedWeightsEqualTheSeparateLayers) {
  expect_merged_equals_separate(at::kFloat, false, false, 1e-5);
  expect_merged_equals_separate(at::kFloat, false, true, 1e-5);
}

TEST(MergedLinear, Bf16EqualsTheSeparateLayersWithinBf16) {
  expect_merged_equals_separate(at::kBFloat16, true, true, 2e-2);
  expect_merged_equals_separate(at::kBFloat16, false, false, 2e-2);
}

TEST(MergedLinear, PackRowsKeepsValuesAndObjectsAndViewsInPlace) {
  Case c = make_case(at::kFloat, false, false);
  std::vector<at::Tensor> values;
  for (const auto& w : c.weights) values.push_back(w.detach().clone());
  const c10::TensorImpl* first = c.weights[0].unsafeGetTensorImpl();
  const at::Tensor merged = pack_rows({c.weights[0], c.weights[1], c.weights[2]});
  EXPECT_TRUE(rows_adjacent(c.weights));
  EXPECT_EQ(c.weights[0].unsafeGetTensorImpl(), first) << "the parameter is the same object";
  for (size_t i = 0; i < values.size(); ++i) EXPECT_TRUE(at::equal(c.weights[i], values[i]));
  EXPECT_EQ(merged_rows(c.weights).data_ptr(), c.weights[0].data_ptr()) << "adjacent rows are viewed, not copied";
  EXPECT_EQ(merged.sizes(), (at::IntArrayRef{16, 16}));
}

LlamaConfig gqa_llama(bool bias) {
  return {.vocab_size = 64, .hidden_size = 32, .intermediate_size = 48, .num_hidden_layers = 2,
          .num_attention_heads = 4, .num_key_value_heads = 2, .max_position_embeddings = 64,
          .initializer_range = 0.2, .attention_bias = bias, .mlp_bias = bias};
}

// A Linear of another type: LLaMA's merged path does not take it, so a model
// with these runs the separate projections (the reference).
class SeparateLinear : public Linear {
 public:
  explicit SeparateLinear(const Linear& base) : Linear(base.weight, base.bias) {}
};

void use_separate_projections(CausalLM& model) {
  for (const auto& block : model.blocks()) {
    auto& layer = dynamic_cast<LlamaDecoderLayer&>(*block);
    for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
      layer.self_attn().replace_layer(name, std::make_shared<SeparateLinear>(layer.self_attn().layer_as<Linear>(name)));
    }
    for (const char* name : {"gate_proj", "up_proj"}) {
      layer.mlp().replace_layer(name, std::make_shared<SeparateLinear>(layer.mlp().layer_as<Linear>(name)));
    }
  }
}

// Gives k_proj's and up_proj's weights storage of their own (merged_linear copies).
void separate_storage(CausalLM& model) {
  for (const auto& block : model.blocks()) {
    auto& layer = dynamic_cast<LlamaDecoderLayer&>(*block);
    at::Tensor& k = layer.self_attn().layer_as<Linear>("k_proj").weight;
    k.set_data(k.detach().clone());
    at::Tensor& up = layer.mlp().layer_as<Linear>("up_proj").weight;
    up.set_data(up.detach().clone());
  }
}

void expect_model_merged_equals_separate(at::ScalarType dtype, bool bias, bool adjacent, double tolerance) {
  auto merged = create_model(gqa_llama(bias), {.seed = 5, .dtype = dtype});
  auto separate = create_model(gqa_llama(bias), {.seed = 5, .dtype = dtype});
  auto& attn = dynamic_cast<LlamaDecoderLayer&>(*merged->blocks()[0]).self_attn();
  std::vector<at::Tensor> qkv{attn.layer_as<Linear>("q_proj").weight, attn.layer_as<Linear>("k_proj").weight,
                              attn.layer_as<Linear>("v_proj").weight};
  EXPECT_TRUE(rows_adjacent(qkv)) << "construction allocates q/k/v back to back";
  if (!adjacent) separate_storage(*merged);
  EXPECT_EQ(rows_adjacent(qkv), adjacent);
  use_separate_projections(*separate);
  merged->train();
  separate->train();
  at::manual_seed(6);
  const at::Tensor ids = at::randint(0, 64, {2, 9}, at::kLong);
  const at::Tensor logits = merged->forward(ids), logits_ref = separate->forward(ids);
  EXPECT_LE(rel_diff(logits, logits_ref), tolerance);
  merged->loss(logits, ids).backward();
  separate->loss(logits_ref, ids).backward();
  const auto params = merged->named_parameters(), params_ref = separate->named_parameters();
  ASSERT_EQ(params.size(), params_ref.size());
  for (const auto& item : params) {
    const at::Tensor* ref = params_ref.find(item.key());
    ASSERT_NE(ref, nullptr) << item.key();
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_LE(rel_diff(item.value().grad(), ref->grad()), tolerance) << item.key();
  }
}

TEST(MergedProjections, LlamaGqaTrainingEqualsSeparateProjectionsFp32) {
  expect_model_merged_equals_separate(at::kFloat, false, true, 1e-4);
  expect_model_merged_equals_separate(at::kFloat, true, true, 1e-4);
  expect_model_merged_equals_separate(at::kFloat, false, false, 1e-4);
}

TEST(MergedProjections, LlamaGqaTrainingEqualsSeparateProjectionsBf16) {
  expect_model_merged_equals_separate(at::kBFloat16, false, true, 0.1);
  expect_model_merged_equals_separate(at::kBFloat16, true, false, 0.1);
}

// FP8 layers are Linear subclasses the merged matmul would bypass: training's
// output must be the FP8 layers' (as eval's, which runs the layers one by one).
TEST(MergedProjections, Fp8LayersTakeTheSeparatePath) {
  auto model = create_model(gqa_llama(false), {.seed = 7});
  ASSERT_GT(enable_fp8(*model, {}, /*keep_first_last=*/false), 0);
  const at::Tensor ids = at::randint(0, 64, {2, 9}, at::kLong);
  model->eval();
  at::Tensor eval_logits;
  {
    at::NoGradGuard no_grad;
    eval_logits = model->forward(ids);
  }
  model->train();
  const at::Tensor train_logits = model->forward(ids);
  EXPECT_LE(rel_diff(train_logits, eval_logits), 1e-6);
  auto plain = create_model(gqa_llama(false), {.seed = 7});
  plain->train();
  EXPECT_GT(rel_diff(plain->forward(ids), train_logits), 1e-4) << "FP8 made no difference: no check";
}

}  // namespace
}  // namespace colossus::models
