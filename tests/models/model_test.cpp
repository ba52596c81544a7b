// Model structure and behaviour without the oracle: HF names and shapes,
// seeded init, causality, the loss, the block interface (pipeline ranges,
// wrapped blocks), replaceable layers, tensor-parallel slicing, and the
// strictness of loading.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/gpt2.h"
#include "colossus/models/llama.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>

#include <cmath>

namespace colossus::models {
namespace {

namespace fs = std::filesystem;
using testing::max_abs_diff;
using testing::random_ids;

std::map<std::string, std::vector<int64_t>> shapes_of(const CausalLM& model) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  return shapes;
}

TEST(Models, Gpt2HasHfNamesAndConv1DShapes) {
  auto model = create_model(preset("gpt2-tiny"));  // C 64, 2 layers, vocab 128, 64 positions
  auto shapes = shapes_of(*model);
  EXPECT_EQ(shapes.size(), 4 + 2 * 12u);
  EXPECT_EQ(shapes.at("transformer.wte.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shapes.at("transformer.wpe.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes.at("transformer.h.1.attn.c_attn.weight"), (std::vector<int64_t>{64, 192}));  // (in, out)
  EXPECT_EQ(shapes.at("transformer.h.1.attn.c_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes.at("transformer.h.0.mlp.c_fc.weight"), (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(shapes.at("transformer.h.0.mlp.c_proj.weight"), (std::vector<int64_t>{256, 64}));
  EXPECT_TRUE(shapes.contains("transformer.h.0.ln_1.bias"));
  EXPECT_TRUE(shapes.contains("transformer.ln_f.weight"));
  EXPECT_FALSE(shapes.contains("lm_head.weight"));  // tied: one tensor, as HF saves it
  EXPECT_TRUE(model->tied_embeddings());
  EXPECT_EQ(model->blocks().size(), 2u);
}

TEST(Models, LlamaHasHfNamesAndGqaShapes) {
  auto model = create_model(preset("llama-tiny"));  // C 64, 4 heads, 2 kv heads, FFN 160, vocab 128
  auto shapes = shapes_of(*model);
  EXPECT_EQ(shapes.size(), 3 + 2 * 9u);
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.v_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.gate_proj.weight"), (std::vector<int64_t>{160, 64}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.down_proj.weight"), (std::vector<int64_t>{64, 160}));
  EXPECT_TRUE(shapes.contains("model.layers.1.post_attention_layernorm.weight"));
  EXPECT_TRUE(shapes.contains("model.norm.weight"));
  EXPECT_EQ(shapes.at("lm_head.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_FALSE(shapes.contains("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(model->tied_embeddings());
}

TEST(Models, InitIsSeededPerParameterAndFollowsHf) {
  // Wide enough for tight statistics, small enough to build three times quickly.
  GPT2Config config{.vocab_size = 128, .n_positions = 16, .n_embd = 256, .n_layer = 12, .n_head = 4};
  auto a = create_model(config, {.seed = 3});
  auto b = create_model(config, {.seed = 3});
  auto c = create_model(config, {.seed = 4});
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  for (const auto& item : pa) EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
  EXPECT_FALSE(at::equal(pa["transformer.wte.weight"], pc["transformer.wte.weight"]));
  // HF: N(0, 0.02); residual projections N(0, 0.02 / sqrt(2 * n_layer)); norms 1; biases 0.
  EXPECT_NEAR(pa["transformer.h.5.mlp.c_fc.weight"].std().item<double>(), 0.02, 2e-4);
  EXPECT_NEAR(pa["transformer.h.5.mlp.c_proj.weight"].std().item<double>(), 0.02 / std::sqrt(24.0), 1e-4);
  EXPECT_NEAR(pa["transformer.h.5.attn.c_proj.weight"].std().item<double>(), 0.02 / std::sqrt(24.0), 1e-4);
  EXPECT_TRUE(at::equal(pa["transformer.h.5.ln_2.weight"], at::ones_like(pa["transformer.h.5.ln_2.weight"])));
  EXPECT_TRUE(at::equal(pa["transformer.h.5.attn.c_attn.bias"], at::zeros_like(pa["transformer.h.5.attn.c_attn.bias"])));
  // The same seed gives the same values in another dtype (drawn on CPU in fp32).
  auto d = create_model(preset("gpt2-tiny"), {.seed = 3, .dtype = c10::kDouble});
  auto e = create_model(preset("gpt2-tiny"), {.seed = 3});
  EXPECT_TRUE(at::equal(d->named_parameters()["transformer.wte.weight"].to(at::kFloat), e->named_parameters()["transformer.wte.weight"]));

  auto llama_config = std::get<LlamaConfig>(preset("llama-tiny"));
  llama_config.pad_token_id = 5;
  auto llama = create_model(llama_config, {.seed = 1});
  at::Tensor embed = llama->named_parameters()["model.embed_tokens.weight"];
  EXPECT_EQ(embed[5].abs().sum().item<double>(), 0.0);  // HF zeroes the padding row
  EXPECT_GT(embed[6].abs().sum().item<double>(), 0.0);
}

TEST(Models, LogitsAreCausalAndShaped) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    auto model = create_model(preset(name), {.seed = 1});
    model->eval();
    at::NoGradGuard no_grad;
    at::Tensor ids = random_ids(3, 10, 128, 5);
    at::Tensor logits = model->forward(ids);
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10, 128})) << name;
    at::Tensor changed = ids.clone();
    changed.select(1, 7).fill_(1).add_(ids.select(1, 7)).remainder_(128);
    at::Tensor logits_changed = model->forward(changed);
    EXPECT_LE(max_abs_diff(logits.narrow(1, 0, 7), logits_changed.narrow(1, 0, 7)), 0.0) << name;
    EXPECT_GT(max_abs_diff(logits.narrow(1, 7, 3), logits_changed.narrow(1, 7, 3)), 0.0) << name;
  }
}

TEST(Models, LossShiftsLabelsIgnoresMinus100AndScalesByNumItems) {
  at::Tensor logits = at::randn({2, 5, 11}, at::kDouble);
  at::Tensor labels = random_ids(2, 5, 11, 9);
  labels[0][2] = -100;
  // By hand: position t predicts labels[t + 1]; 2*4 targets, one ignored.
  double total = 0;
  int count = 0;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t + 1 < 5; ++t) {
      int64_t target = labels[b][t + 1].item<int64_t>();
      if (target == -100) continue;
      at::Tensor row = logits[b][t].to(at::kFloat);
      total += (row.exp().sum().log() - row[target]).item<double>();
      ++count;
    }
  }
  EXPECT_EQ(count, 7);
  EXPECT_NEAR(causal_lm_loss(logits, labels).item<double>(), total / count, 1e-5);
  EXPECT_NEAR(causal_lm_loss(logits, labels, 14).item<double>(), total / 14, 1e-5);
  EXPECT_THROW(causal_lm_loss(logits, labels.narrow(1, 0, 4)), ConfigError);
  EXPECT_THROW(causal_lm_loss(logits, labels, 0), ConfigError);
}

TEST(Models, BadInputsAreConfigErrors) {
  auto gpt2 = create_model(preset("gpt2-tiny"));
  EXPECT_THROW(gpt2->forward(at::zeros({2, 65}, at::kLong)), ConfigError);  // n_positions 64
  EXPECT_THROW(gpt2->forward(at::zeros({2, 4}, at::kInt)), ConfigError);
  EXPECT_THROW(gpt2->forward(at::zeros({8}, at::kLong)), ConfigError);
  EXPECT_THROW(gpt2->forward_blocks(at::zeros({1, 2, 64}), {}, 1, 3), ConfigError);
}

TEST(Models, PipelineRangesOfBlocksComposeToTheFullForward) {
  auto model = create_model(preset("llama-tiny"), {.seed = 2});
  model->eval();
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(2, 12, 128, 1);
  // Two "stages": embed + block 0, then block 1 + norm + head.
  at::Tensor hidden = model->embed(ids);
  BlockContext context = model->block_context(hidden);
  hidden = model->forward_blocks(hidden, context, 0, 1);
  at::Tensor logits = model->head(model->final_norm(model->forward_blocks(hidden, context, 1, 2)));
  EXPECT_TRUE(at::equal(logits, model->forward(ids)));
}

// What a ZeRO-3 or pipeline wrapper looks like: it adopts the wrapped block's
// children (so parameter names stay HF's) and intercepts the virtual forward.
class CountingBlock : public TransformerBlock {
 public:
  explicit CountingBlock(std::shared_ptr<TransformerBlock> inner) : TransformerBlock("CountingBlock"), inner_(std::move(inner)) {
    for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
  }
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override {
    ++calls;
    return inner_->forward(hidden, context);
  }
  int calls = 0;

 private:
  std::shared_ptr<TransformerBlock> inner_;
};

TEST(Models, WrappedBlocksKeepNamesAndResults) {
  auto model = create_model(preset("gpt2-tiny"), {.seed = 2});
  model->eval();
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(2, 8, 128, 3);
  at::Tensor before = model->forward(ids);
  auto names_before = shapes_of(*model);
  auto wrapper = std::make_shared<CountingBlock>(model->blocks()[1]);
  model->replace_block(1, wrapper);
  EXPECT_EQ(shapes_of(*model), names_before);
  EXPECT_TRUE(at::equal(model->forward(ids), before));
  EXPECT_EQ(wrapper->calls, 1);
  EXPECT_THROW(model->replace_block(2, wrapper), ConfigError);
}

// A stand-in for a parallel layer: a Linear whose output is scaled.
class ScaledLinear : public Linear {
 public:
  ScaledLinear(const at::Tensor& base_weight, double scale)
      : Linear(base_weight.size(1), base_weight.size(0), false, base_weight.options()), scale_(scale) {
    at::NoGradGuard no_grad;
    weight.copy_(base_weight);
  }
  at::Tensor forward(const at::Tensor& x) override { return Linear::forward(x) * scale_; }

 private:
  double scale_;
};

TEST(Models, LayersAreReplaceableByPath) {
  auto model = create_model(preset("llama-tiny"), {.seed = 2});
  model->eval();
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(1, 6, 128, 3);
  at::Tensor before = model->forward(ids);
  auto& block = dynamic_cast<LlamaDecoderLayer&>(*model->blocks()[0]);
  // Kept by value: the replaced module is gone after the first swap.
  at::Tensor down = block.mlp().layer_as<Linear>("down_proj").weight;
  replace_layer(*model, "model.layers.0.mlp.down_proj", std::make_shared<ScaledLinear>(down, 1.0));
  EXPECT_TRUE(at::equal(model->forward(ids), before));  // same weights, new module in use
  replace_layer(*model, "model.layers.0.mlp.down_proj", std::make_shared<ScaledLinear>(down, 0.0));
  // Block 0's MLP now contributes nothing: the output changes.
  EXPECT_GT(max_abs_diff(model->forward(ids), before), 1e-6);
  EXPECT_TRUE(model->named_parameters().contains("model.layers.0.mlp.down_proj.weight"));
  EXPECT_THROW(replace_layer(*model, "model.layers.0.mlp.no_such_proj", std::make_shared<ScaledLinear>(down, 1.0)), ConfigError);
  EXPECT_THROW(replace_layer(*model, "model.layers.9.mlp.down_proj", std::make_shared<ScaledLinear>(down, 1.0)), ConfigError);
}

// Rows [begin, begin + count) of a (out, in) weight into a new Linear.
std::shared_ptr<Linear> rows_of(const Linear& full, int64_t begin, int64_t count) {
  auto part = std::make_shared<Linear>(full.weight.size(1), count, full.bias.defined(), full.weight.options());
  part->weight.copy_(full.weight.narrow(0, begin, count));
  if (full.bias.defined()) part->bias.copy_(full.bias.narrow(0, begin, count));
  return part;
}

std::shared_ptr<Linear> columns_of(const Linear& full, int64_t begin, int64_t count) {
  auto part = std::make_shared<Linear>(count, full.weight.size(0), false, full.weight.options());
  part->weight.copy_(full.weight.narrow(1, begin, count));
  return part;
}

// Emulates tensor parallelism of degree 2 in one process: each "rank" holds
// half the heads (and half the FFN); the sum of the two partial outputs is the
// full output, because the modules size themselves from their weights.
TEST(Models, LlamaModulesRunOnTensorParallelSlices) {
  auto config = std::get<LlamaConfig>(preset("llama-tiny"));  // 4 heads, 2 kv heads, D 16, FFN 160
  auto model = create_model(config, {.seed = 8});
  at::NoGradGuard no_grad;
  auto& block = dynamic_cast<LlamaDecoderLayer&>(*model->blocks()[0]);
  at::Tensor x = at::randn({2, 7, 64});
  BlockContext context = model->block_context(x);
  at::Tensor full_attn = block.self_attn().forward(x, context);
  at::Tensor full_mlp = block.mlp().forward(x);

  at::Tensor attn_sum = at::zeros_like(full_attn), mlp_sum = at::zeros_like(full_mlp);
  for (int64_t rank = 0; rank < 2; ++rank) {
    LlamaAttention attn(config, x.options());
    LlamaMLP mlp(config, x.options());
    auto& full = block.self_attn();
    attn.replace_layer("q_proj", rows_of(full.layer_as<Linear>("q_proj"), rank * 32, 32));  // 2 of 4 heads
    attn.replace_layer("k_proj", rows_of(full.layer_as<Linear>("k_proj"), rank * 16, 16));  // 1 of 2 kv heads
    attn.replace_layer("v_proj", rows_of(full.layer_as<Linear>("v_proj"), rank * 16, 16));
    attn.replace_layer("o_proj", columns_of(full.layer_as<Linear>("o_proj"), rank * 32, 32));
    mlp.replace_layer("gate_proj", rows_of(block.mlp().layer_as<Linear>("gate_proj"), rank * 80, 80));
    mlp.replace_layer("up_proj", rows_of(block.mlp().layer_as<Linear>("up_proj"), rank * 80, 80));
    mlp.replace_layer("down_proj", columns_of(block.mlp().layer_as<Linear>("down_proj"), rank * 80, 80));
    attn_sum += attn.forward(x, context);
    mlp_sum += mlp.forward(x);
  }
  EXPECT_LE(max_abs_diff(attn_sum, full_attn), 1e-6);
  EXPECT_LE(max_abs_diff(mlp_sum, full_mlp), 1e-6);
}

TEST(Models, Gpt2AttentionRunsOnTensorParallelSlices) {
  auto config = std::get<GPT2Config>(preset("gpt2-tiny"));  // C 64, 4 heads of 16
  auto model = create_model(config, {.seed = 8});
  at::NoGradGuard no_grad;
  auto& block = dynamic_cast<GPT2Block&>(*model->blocks()[1]);
  auto& c_attn = block.attn().layer_as<Conv1D>("c_attn");
  auto& c_proj = block.attn().layer_as<Conv1D>("c_proj");
  at::Tensor x = at::randn({2, 5, 64});
  at::Tensor full = block.attn().forward(x);
  at::Tensor sum = at::zeros_like(full);
  for (int64_t rank = 0; rank < 2; ++rank) {
    GPT2Attention attn(config, 1, x.options());
    // c_attn's columns are [q | k | v]: each rank takes its half of each.
    auto qkv = std::make_shared<Conv1D>(64, 96, x.options());
    for (int64_t part = 0; part < 3; ++part) {
      qkv->weight.narrow(1, part * 32, 32).copy_(c_attn.weight.narrow(1, part * 64 + rank * 32, 32));
      qkv->bias.narrow(0, part * 32, 32).copy_(c_attn.bias.narrow(0, part * 64 + rank * 32, 32));
    }
    auto proj = std::make_shared<Conv1D>(32, 64, x.options());
    proj->weight.copy_(c_proj.weight.narrow(0, rank * 32, 32));
    proj->bias.copy_(rank == 0 ? c_proj.bias : at::zeros_like(c_proj.bias));  // the bias is added once
    attn.replace_layer("c_attn", qkv);
    attn.replace_layer("c_proj", proj);
    sum += attn.forward(x);
  }
  EXPECT_LE(max_abs_diff(sum, full), 1e-6);
}

TEST(Models, DropoutActsOnlyInTraining) {
  auto config = std::get<GPT2Config>(preset("gpt2-tiny"));
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.5;
  auto model = create_model(config, {.seed = 1});
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(1, 8, 128, 2);
  model->eval();
  EXPECT_TRUE(at::equal(model->forward(ids), model->forward(ids)));
  model->train();
  EXPECT_FALSE(at::equal(model->forward(ids), model->forward(ids)));
}

// Phi-3's resid_pdrop drops the attention and MLP outputs in training only:
// in eval the model is the one without dropout.
TEST(Models, Phi3ResidualDropoutActsOnlyInTraining) {
  auto config = std::get<LlamaConfig>(preset("phi3-tiny"));
  auto plain = create_model(config, {.seed = 1});
  config.resid_pdrop = 0.5;
  auto model = create_model(config, {.seed = 1});
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(1, 8, 128, 2);
  model->eval();
  plain->eval();
  EXPECT_TRUE(at::equal(model->forward(ids), plain->forward(ids)));
  model->train();
  EXPECT_FALSE(at::equal(model->forward(ids), model->forward(ids)));
  auto llama = std::get<LlamaConfig>(preset("llama-tiny"));
  llama.resid_pdrop = 0.1;
  EXPECT_THROW(llama.validate(), ConfigError) << "only Phi-3 has resid_pdrop";
}

TEST(Models, BackwardGivesFiniteGradientsEverywhere) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "phi3-tiny"}) {
    auto model = create_model(preset(name), {.seed = 4});
    at::Tensor ids = random_ids(2, 9, 128, 6);
    model->loss(model->forward(ids), ids).backward();
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& grad = item.value().grad();
      ASSERT_TRUE(grad.defined()) << name << " " << item.key();
      EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << name << " " << item.key();
      EXPECT_GT(grad.abs().max().item<double>(), 0.0) << name << " " << item.key();
    }
  }
}

std::string checkpoint_error_of(CausalLM& model, const std::map<std::string, at::Tensor>& state) {
  try {
    load_state_dict(model, state, "test-checkpoint");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

TEST(Models, LoadingIsStrictAndNamesTheProblems) {
  auto source = create_model(preset("gpt2-tiny"), {.seed = 1});
  auto target = create_model(preset("gpt2-tiny"), {.seed = 2});
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, tensor] : state_dict(*source)) state[name] = tensor;

  auto missing = state;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  EXPECT_NE(checkpoint_error_of(*target, missing).find("missing 1 tensor(s): transformer.h.1.mlp.c_fc.bias"), std::string::npos);
  auto unexpected = state;
  unexpected["transformer.h.7.attn.c_attn.weight"] = at::zeros({64, 192});
  EXPECT_NE(checkpoint_error_of(*target, unexpected).find("unexpected 1 tensor(s): transformer.h.7.attn.c_attn.weight"),
            std::string::npos);
  auto mismatched = state;
  mismatched["transformer.wpe.weight"] = at::zeros({32, 64});
  std::string message = checkpoint_error_of(*target, mismatched);
  EXPECT_NE(message.find("transformer.wpe.weight (file [32, 64] vs model [64, 64])"), std::string::npos) << message;
  EXPECT_EQ(message.find("missing"), std::string::npos) << message;

  // Accepted as HF accepts them: no base-model prefix, the legacy attention
  // mask buffer, a tied lm_head; values then equal the source's.
  std::map<std::string, at::Tensor> legacy;
  for (const auto& [name, tensor] : state) legacy[name.substr(std::string("transformer.").size())] = tensor;
  legacy["h.0.attn.bias"] = at::ones({1, 1, 64, 64});
  legacy["lm_head.weight"] = state.at("transformer.wte.weight");
  load_state_dict(*target, legacy, "legacy");
  auto loaded = target->named_parameters();
  for (const auto& [name, tensor] : state) EXPECT_TRUE(at::equal(loaded[name], tensor)) << name;
}

TEST(Models, SavePretrainedRoundTripsAndConvertsDtype) {
  auto config = std::get<LlamaConfig>(preset("llama-tiny"));
  config.rope_scaling = {.rope_type = "dynamic", .factor = 2.0};
  auto model = create_model(config, {.seed = 5});
  testing::perturb_parameters(*model, 6);
  const fs::path dir = testing::scratch_dir() / "roundtrip";
  save_pretrained(*model, dir.string());
  auto loaded = load_pretrained(dir.string());
  EXPECT_EQ(config_to_json(loaded->config()).find("\"dynamic\"") != std::string::npos, true);
  at::NoGradGuard no_grad;
  at::Tensor ids = random_ids(2, 150, 128, 1);  // past max_position_embeddings: dynamic RoPE in effect
  EXPECT_TRUE(at::equal(loaded->forward(ids), model->forward(ids)));

  // bf16 on disk, recorded as torch_dtype; loads back into fp32 by default.
  auto bf16 = create_model(config, {.seed = 5, .dtype = c10::kBFloat16});
  const fs::path bf16_dir = testing::scratch_dir() / "roundtrip_bf16";
  save_pretrained(*bf16, bf16_dir.string());
  EXPECT_EQ(checkpoint::SafetensorsFile::open((bf16_dir / "model.safetensors").string()).dtype("lm_head.weight"), c10::kBFloat16);
  EXPECT_NE(config_to_json(read_config((bf16_dir / "config.json").string())).find("\"torch_dtype\": \"bfloat16\""), std::string::npos);
  auto widened = load_pretrained(bf16_dir.string());
  EXPECT_EQ(widened->named_parameters()["lm_head.weight"].scalar_type(), c10::kFloat);
  EXPECT_TRUE(at::equal(widened->named_parameters()["lm_head.weight"], bf16->named_parameters()["lm_head.weight"].to(at::kFloat)));

  EXPECT_THROW(load_pretrained((testing::scratch_dir() / "no_such_model").string()), CheckpointError);
}

}  // namespace
}  // namespace colossus::models
