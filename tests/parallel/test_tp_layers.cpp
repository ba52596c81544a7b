// Tensor-parallel layers against their unsharded forms, tp = the world size:
// column/row-parallel linear (both weight layouts, gather/scatter options),
// the vocab-parallel embedding and head + cross-entropy with vocab padding,
// whole sharded models (GPT-2's fused c_attn, LLaMA GQA with kv heads < tp)
// forward and backward, the local shapes a plan produces, and config errors.
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/core/errors.h"
#include "colossus/models/fp8_linear.h"
#include "colossus/models/pretrained.h"
#include "colossus/parallel/plan/sharder.h"
#include "colossus/parallel/tensor/cross_entropy.h"
#include "colossus/parallel/tensor/layers.h"
#include "tests/booster/booster_testing.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

using namespace colossus;
namespace ct = colossus::testing;
namespace pt = colossus::parallel::tensor;
namespace pp = colossus::parallel::plan;

namespace {

at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kFloat);
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LE(ct::max_rel_diff(got, want), tol) << what;
}

struct LinearCase {
  pt::WeightLayout layout;
  bool bias;
};

}  // namespace

TEST(TensorParallelLayers, ColumnAndRowMatchUnsharded) {
  auto world = ct::world();
  const int tp = world->size(), rank = world->rank();
  const int64_t in = 8, out = 16;
  for (auto c : {LinearCase{pt::WeightLayout::OutIn, true}, LinearCase{pt::WeightLayout::InOut, true},
                 LinearCase{pt::WeightLayout::OutIn, false}}) {
    const bool out_in = c.layout == pt::WeightLayout::OutIn;
    for (bool column : {true, false}) {
      for (bool option : {false, true}) {  // column: gather_output; row: !input_is_parallel
        const int64_t w_in = column ? in : out, w_out = column ? out : in;
        at::Tensor w = out_in ? seeded({w_out, w_in}, 1) : seeded({w_in, w_out}, 1);
        at::Tensor b = c.bias ? seeded({w_out}, 2) : at::Tensor();
        at::Tensor x = seeded({2, 3, w_in}, 3).requires_grad_(true);
        at::Tensor r = seeded({2, 3, w_out}, 4);
        auto w_ref = w.clone().requires_grad_(true);
        auto b_ref = c.bias ? b.clone().requires_grad_(true) : at::Tensor();
        at::Tensor y_ref = at::linear(x, out_in ? w_ref : w_ref.t(), b_ref);
        (y_ref * r).sum().backward();

        const int64_t split_dim = column ? (out_in ? 0 : 1) : (out_in ? 1 : 0);
        auto spec = pp::ShardSpec::even(split_dim, w.size(split_dim), tp);
        at::Tensor w_local = pp::slice_for_rank(w, spec, rank), b_local;
        if (c.bias) b_local = column ? pp::slice_for_rank(b, pp::ShardSpec::even(0, w_out, tp), rank) : b.clone();
        at::Tensor x2 = x.detach().clone().requires_grad_(true);
        std::shared_ptr<models::Layer> layer;
        at::Tensor input = x2;
        if (column) {
          layer = std::make_shared<pt::ColumnParallelLinear>(
              w_local, b_local, world, pt::ColumnParallelOptions{.layout = c.layout, .gather_output = option});
        } else {
          layer = std::make_shared<pt::RowParallelLinear>(
              w_local, b_local, world, pt::RowParallelOptions{.layout = c.layout, .input_is_parallel = !option});
          if (!option) input = x2.narrow(-1, rank * (w_in / tp), w_in / tp);
        }
        at::Tensor y = layer->forward(input);
        const bool local_out = column && !option;
        at::Tensor r_mine = local_out ? r.narrow(-1, rank * (w_out / tp), w_out / tp) : r;
        at::Tensor y_want = local_out ? y_ref.narrow(-1, rank * (w_out / tp), w_out / tp) : y_ref;
        const std::string what = fmt::format("{} {} bias={} option={}", column ? "column" : "row",
                                             out_in ? "OutIn" : "InOut", c.bias, option);
        expect_close(y.detach(), y_want.detach(), what + " output");
        // Every rank backpropagates its loss: the whole loss where the output
        // is replicated, its share of the sum where the output is split.
        (y * r_mine).sum().backward();
        if (!column && !option) {
          // The input came already split: only this rank's slice has a gradient here.
          const int64_t width = w_in / tp;
          expect_close(x2.grad().narrow(-1, rank * width, width), x.grad().narrow(-1, rank * width, width),
                       what + " x grad");
        } else {
          expect_close(x2.grad(), x.grad(), what + " x grad");
        }
        at::Tensor w_grad = w_local.grad();
        expect_close(w_grad, pp::slice_for_rank(w_ref.grad(), spec, rank), what + " weight grad");
      }
    }
  }
}

TEST(TensorParallelLayers, VocabEmbeddingHeadAndCrossEntropyMatchUnsharded) {
  auto world = ct::world();
  const int tp = world->size(), rank = world->rank();
  const int64_t vocab = 96, dim = 8;
  const int64_t padded = (vocab + 64 * tp - 1) / (64 * tp) * (64 * tp);  // make_vocab_size_divisible_by 64 x tp
  pp::ShardSpec spec = pp::ShardSpec::even(0, padded, tp);
  spec.true_size = vocab;
  const int64_t start = spec.ranges[rank][0].first;

  // Embedding, with a padding row (LLaMA's pad token) that takes no gradient.
  at::Tensor table = seeded({vocab, dim}, 5);
  auto ids = at::randint(vocab, {3, 7}, at::make_generator<at::CPUGeneratorImpl>(6), at::kLong);
  ids[0][0] = 5;
  auto table_ref = table.clone().requires_grad_(true);
  at::Tensor r = seeded({3, 7, dim}, 7);
  (at::embedding(table_ref, ids, 5) * r).sum().backward();
  at::Tensor local_table = pp::slice_for_rank(table, spec, rank);
  pt::VocabParallelEmbedding embedding(local_table, start, 5, world);
  at::Tensor e = embedding.forward(ids);
  expect_close(e.detach(), at::embedding(table, ids), "embedding output");
  (e * r).sum().backward();
  expect_close(embedding.weight.grad(), pp::slice_for_rank(table_ref.grad(), spec, rank), "embedding grad");

  // Head + cross-entropy: the loss and every gradient, with ignored labels.
  at::Tensor w = seeded({vocab, dim}, 8);
  at::Tensor hidden = seeded({3, 7, dim}, 9).requires_grad_(true);
  at::Tensor labels = ids.clone();
  labels[1][3] = -100;
  auto w_ref = w.clone().requires_grad_(true);
  at::Tensor loss_ref = models::causal_lm_loss(at::linear(hidden, w_ref), labels);
  loss_ref.backward();
  at::Tensor hidden2 = hidden.detach().clone().requires_grad_(true);
  pt::VocabParallelHead head(pp::slice_for_rank(w, spec, rank), world);
  at::Tensor local_logits = head.forward(hidden2);
  ASSERT_EQ(local_logits.size(-1), padded / tp);
  at::Tensor loss =
      pt::vocab_parallel_causal_lm_loss(local_logits, labels, {.vocab_start = start, .true_vocab = vocab}, *world);
  expect_close(loss.detach(), loss_ref.detach(), "vocab-parallel loss");
  loss.backward();
  expect_close(hidden2.grad(), hidden.grad(), "hidden grad");
  expect_close(head.weight.grad(), pp::slice_for_rank(w_ref.grad(), spec, rank), "head weight grad");
  // Padding columns get no gradient at all.
  for (int64_t row = 0; row < padded / tp; ++row) {
    if (start + row >= vocab) {
      EXPECT_EQ(head.weight.grad()[row].abs().max().item<float>(), 0.0f) << "padded row";
    }
  }
  // Summed with num_items, as the gradient-accumulation path uses it.
  auto sum_ref = models::causal_lm_loss(at::linear(hidden, w), labels, 50);
  auto sum = pt::vocab_parallel_causal_lm_loss(head.forward(hidden), labels,
                                               {.vocab_start = start, .true_vocab = vocab}, *world, 50);
  expect_close(sum.detach(), sum_ref.detach(), "num_items loss");
}

namespace {

models::ModelConfig llama_kv1() {
  auto config = std::get<models::LlamaConfig>(booster::testing::tiny_llama());
  config.num_key_value_heads = 1;
  return config;
}

}  // namespace

// Whole models through the plugin's wrapper (tp = world, dp = 1): the loss and
// every parameter gradient, gathered back to full, equal the unsharded model's.
TEST(TensorParallelLayers, ShardedModelsMatchUnsharded) {
  auto world = ct::world();
  for (const auto& config : {booster::testing::tiny_gpt2(), booster::testing::tiny_llama(), llama_kv1()}) {
    auto full = models::create_model(config, {.seed = 3});
    auto ids = booster::testing::global_batch(config, 0).narrow(0, 0, 4);
    at::Tensor loss_ref = full->loss(full->forward(ids), ids);
    loss_ref.backward();
    booster::HybridParallelPlugin plugin({.tp_size = world->size()}, world);
    auto wrapped = plugin.wrap_model(models::create_model(config, {.seed = 3}));
    auto& hybrid = dynamic_cast<booster::HybridParallelModel&>(*wrapped);
    at::Tensor loss = wrapped->loss(wrapped->forward(ids), ids);
    const std::string name = models::model_type(config) + " kv=" +
                             std::to_string(std::visit(
                                 [](const auto& c) {
                                   if constexpr (std::is_base_of_v<models::LlamaConfig, std::decay_t<decltype(c)>>)
                                     return c.kv_heads();
                                   else
                                     return c.n_head;
                                 },
                                 config));
    expect_close(loss.detach(), loss_ref.detach(), name + " loss");
    loss.backward();
    auto full_params = full->named_parameters();
    for (const auto& item : wrapped->unwrap().named_parameters()) {
      at::Tensor grad = item.value().grad();
      auto spec = hybrid.sharded().specs.find(item.key());
      if (spec != hybrid.sharded().specs.end()) grad = pp::gather_full(grad, spec->second, *plugin.tp_group());
      expect_close(grad, full_params[item.key()].grad(), name + " grad of " + item.key(), 2e-5);
    }
    // parallel_output = false: full logits with the true vocab.
    booster::HybridParallelPlugin gathered({.tp_size = world->size(), .parallel_output = false}, world);
    auto wrapped2 = gathered.wrap_model(models::create_model(config, {.seed = 3}));
    at::Tensor logits = wrapped2->forward(ids);
    expect_close(logits.detach(), full->forward(ids).detach(), name + " gathered logits");
  }
}

// FP8 under tensor parallelism (issue 28): each rank's local matmul runs
// through models::fp8_linear on its own shards, so a column-parallel output
// is exactly fp8_linear on this rank's weight rows and a row-parallel one the
// sum of every rank's fp8_linear on its input and weight columns. The sharder
// carries an FP8 leaf's recipe into the parallel layer: a tiny LLaMA with
// enable_fp8 trains through the plugin with FP8 in every block's projection,
// its loss that of the unsharded FP8 model (exactly on one rank, within the
// per-shard scales' difference on more).
TEST(TensorParallelLayers, Fp8LayersAndShardedModels) {
  auto world = ct::world();
  const int tp = world->size(), rank = world->rank();
  const models::Fp8Recipe recipe{};
  const int64_t in = 32, out = 64;
  for (const auto layout : {pt::WeightLayout::OutIn, pt::WeightLayout::InOut}) {
    const bool out_in = layout == pt::WeightLayout::OutIn;
    const auto as_linear = [&](const at::Tensor& w) { return out_in ? w : w.t(); };
    for (bool column : {true, false}) {
      const int64_t w_in = column ? in : out, w_out = column ? out : in;
      at::Tensor w = out_in ? seeded({w_out, w_in}, 11) : seeded({w_in, w_out}, 11);
      at::Tensor x = seeded({4, 8, w_in}, 13);
      const int64_t split_dim = column ? (out_in ? 0 : 1) : (out_in ? 1 : 0);
      const auto spec = pp::ShardSpec::even(split_dim, w.size(split_dim), tp);
      at::Tensor w_local = pp::slice_for_rank(w, spec, rank).clone().requires_grad_(true);
      const std::string what = fmt::format("fp8 {} {}", column ? "column" : "row", out_in ? "OutIn" : "InOut");
      at::Tensor y, want, want_w_grad;
      if (column) {
        auto layer = std::make_shared<pt::ColumnParallelLinear>(
            w_local, at::Tensor(), world, pt::ColumnParallelOptions{.layout = layout, .fp8 = recipe});
        y = layer->forward(x);
        at::Tensor w_ref = w_local.detach().clone().requires_grad_(true);
        want = models::fp8_linear(x, as_linear(w_ref), at::Tensor(), recipe);
        want.sum().backward();
        want_w_grad = w_ref.grad();
      } else {
        const int64_t width = w_in / tp;
        auto layer = std::make_shared<pt::RowParallelLinear>(w_local, at::Tensor(), world,
                                                             pt::RowParallelOptions{.layout = layout, .fp8 = recipe});
        y = layer->forward(x.narrow(-1, rank * width, width));
        for (int r = 0; r < tp; ++r) {
          at::Tensor w_r = pp::slice_for_rank(w, spec, r).clone().requires_grad_(r == rank);
          at::Tensor part = models::fp8_linear(x.narrow(-1, r * width, width), as_linear(w_r), at::Tensor(), recipe);
          if (r == rank) {
            part.sum().backward();
            want_w_grad = w_r.grad();
          }
          want = r == 0 ? part.detach() : want + part.detach();
        }
      }
      expect_close(y.detach(), want.detach(), what + " output");
      // Not the full-precision product: FP8 rounding acts.
      EXPECT_GT(ct::max_rel_diff(y.detach(), column ? at::linear(x, as_linear(w_local.detach()))
                                                    : at::linear(x, as_linear(w))),
                1e-4)
          << what;
      y.sum().backward();
      expect_close(w_local.grad(), want_w_grad, what + " weight grad");
    }
  }

  const auto config = booster::testing::tiny_llama();
  auto ids = booster::testing::global_batch(config, 0).narrow(0, 0, 4);
  auto full = models::create_model(config, {.seed = 3});
  const int64_t fp8_layers = models::enable_fp8(*full, recipe, /*keep_first_last=*/false);
  EXPECT_GT(fp8_layers, 0);
  const at::Tensor loss_ref = full->loss(full->forward(ids), ids).detach();
  auto sharded = models::create_model(config, {.seed = 3});
  models::enable_fp8(*sharded, recipe, /*keep_first_last=*/false);
  booster::HybridParallelPlugin plugin({.tp_size = tp}, world);
  auto wrapped = plugin.wrap_model(std::move(sharded));
  int64_t parallel_fp8 = 0;
  for (const auto& module : wrapped->unwrap().modules(/*include_self=*/false)) {
    if (const auto* c = dynamic_cast<const pt::ColumnParallelLinear*>(module.get())) parallel_fp8 += c->options().fp8 ? 1 : 0;
    if (const auto* r = dynamic_cast<const pt::RowParallelLinear*>(module.get())) parallel_fp8 += r->options().fp8 ? 1 : 0;
  }
  if (tp > 1) {
    EXPECT_EQ(parallel_fp8, fp8_layers) << "every FP8 projection keeps its recipe once sharded";
  }
  const at::Tensor loss = wrapped->loss(wrapped->forward(ids), ids);
  expect_close(loss.detach(), loss_ref, "fp8 tiny llama loss", tp == 1 ? 1e-6 : 2e-2);
  loss.backward();
}

TEST(TensorParallelPlan, LocalShapes) {
  auto world = ct::world();
  const int64_t tp = world->size();
  const int64_t padded_rows = (96 + 64 * tp - 1) / (64 * tp) * 64;  // per rank
  {
    auto model = models::create_model(booster::testing::tiny_gpt2(), {.seed = 1});
    auto sharded = pp::shard_model(*model, pp::gpt2_plan(), world);
    auto p = model->named_parameters();
    EXPECT_EQ(p["transformer.wte.weight"].sizes(), (std::vector<int64_t>{padded_rows, 32}));
    EXPECT_EQ(p["transformer.wpe.weight"].sizes(), (std::vector<int64_t>{32, 32}));
    EXPECT_EQ(p["transformer.h.0.attn.c_attn.weight"].sizes(), (std::vector<int64_t>{32, 96 / tp}));
    EXPECT_EQ(p["transformer.h.0.attn.c_attn.bias"].sizes(), (std::vector<int64_t>{96 / tp}));
    EXPECT_EQ(p["transformer.h.1.attn.c_proj.weight"].sizes(), (std::vector<int64_t>{32 / tp, 32}));
    EXPECT_EQ(p["transformer.h.1.attn.c_proj.bias"].sizes(), (std::vector<int64_t>{32}));
    EXPECT_EQ(p["transformer.h.0.mlp.c_fc.weight"].sizes(), (std::vector<int64_t>{32, 128 / tp}));
    EXPECT_EQ(p["transformer.h.0.mlp.c_proj.weight"].sizes(), (std::vector<int64_t>{128 / tp, 32}));
    EXPECT_TRUE(sharded.tied_head);
    EXPECT_EQ(sharded.padded_vocab, padded_rows * tp);
    // The fused split takes this rank's share of each of q, k and v.
    const auto& ranges = sharded.specs.at("transformer.h.0.attn.c_attn.weight").ranges[world->rank()];
    ASSERT_EQ(ranges.size(), 3u);
    for (int64_t part = 0; part < 3; ++part) EXPECT_EQ(ranges[part].first, part * 32 + world->rank() * (32 / tp));
  }
  {
    auto config = std::get<models::LlamaConfig>(booster::testing::tiny_llama());
    config.tie_word_embeddings = false;
    auto model = models::create_model(config, {.seed = 1});
    auto sharded = pp::shard_model(*model, pp::llama_plan(), world);
    auto p = model->named_parameters();
    EXPECT_EQ(p["model.embed_tokens.weight"].sizes(), (std::vector<int64_t>{padded_rows, 32}));
    EXPECT_EQ(p["lm_head.weight"].sizes(), (std::vector<int64_t>{padded_rows, 32}));
    EXPECT_EQ(p["model.layers.0.self_attn.q_proj.weight"].sizes(), (std::vector<int64_t>{32 / tp, 32}));
    // 2 kv heads of 8: split for tp <= 2, one replicated head per rank at tp = 4.
    EXPECT_EQ(p["model.layers.0.self_attn.k_proj.weight"].sizes(), (std::vector<int64_t>{tp <= 2 ? 16 / tp : 8, 32}));
    EXPECT_EQ(p["model.layers.0.self_attn.o_proj.weight"].sizes(), (std::vector<int64_t>{32, 32 / tp}));
    EXPECT_EQ(p["model.layers.0.mlp.up_proj.weight"].sizes(), (std::vector<int64_t>{64 / tp, 32}));
    EXPECT_EQ(p["model.layers.0.mlp.down_proj.weight"].sizes(), (std::vector<int64_t>{32, 64 / tp}));
    EXPECT_EQ(p["model.norm.weight"].sizes(), (std::vector<int64_t>{32}));
    EXPECT_FALSE(sharded.tied_head);
    EXPECT_EQ(sharded.replicas("model.layers.0.self_attn.k_proj.weight"), tp <= 2 ? 1 : 2);
    EXPECT_EQ(sharded.replicas("model.norm.weight"), tp);
  }
}

TEST(TensorParallelPlan, CustomPolicyAndPatterns) {
  EXPECT_TRUE(pp::path_matches("model.layers.*.mlp.up_proj", "model.layers.12.mlp.up_proj"));
  EXPECT_FALSE(pp::path_matches("model.layers.*.mlp.up_proj", "model.layers.1.2.mlp.up_proj"));
  EXPECT_FALSE(pp::path_matches("model.layers.*", "model.layers.1.mlp"));
  auto world = ct::world();
  // Only the MLP sharded: attention stays whole, the vocab too.
  pp::ShardingPlan mlp_only{
      .rules = {{"transformer.h.*.mlp.c_fc", pp::Colwise()}, {"transformer.h.*.mlp.c_proj", pp::Rowwise()}}};
  auto config = booster::testing::tiny_gpt2();
  booster::HybridParallelPlugin plugin({.tp_size = world->size(), .custom_policy = mlp_only}, world);
  auto wrapped = plugin.wrap_model(models::create_model(config, {.seed = 3}));
  EXPECT_EQ(wrapped->unwrap().named_parameters()["transformer.h.0.attn.c_attn.weight"].size(1), 96);
  EXPECT_EQ(wrapped->unwrap().named_parameters()["transformer.h.0.mlp.c_fc.weight"].size(1), 128 / world->size());
  auto ids = booster::testing::global_batch(config, 0);
  auto full = models::create_model(config, {.seed = 3});
  expect_close(wrapped->loss(wrapped->forward(ids), ids).detach(), full->loss(full->forward(ids), ids).detach(),
               "mlp-only loss");
  // A typo in a custom plan is an error, not a silently whole layer.
  pp::ShardingPlan typo{.rules = {{"transformer.h.*.mlp.c_fcc", pp::Colwise()}}};
  auto model = models::create_model(config, {.seed = 3});
  EXPECT_THROW(pp::shard_model(*model, typo, world), ConfigError);
}

TEST(TensorParallelPlan, ConfigErrors) {
  auto world = ct::world();
  // tp must divide the heads (4) and the world.
  EXPECT_THROW(pp::validate_tp(booster::testing::tiny_gpt2(), 3), ConfigError);
  auto kv3 = std::get<models::LlamaConfig>(booster::testing::tiny_llama());
  kv3.num_attention_heads = 12;
  kv3.num_key_value_heads = 3;
  kv3.hidden_size = 96;
  EXPECT_THROW(pp::validate_tp(kv3, 4), ConfigError);  // 3 kv heads and tp 4: neither divides
  EXPECT_NO_THROW(pp::validate_tp(booster::testing::tiny_llama(), 4));
  const int not_dividing = world->size() == 4 ? 3 : world->size() + 1;
  EXPECT_THROW(booster::HybridParallelPlugin({.tp_size = not_dividing}, world), ConfigError);
  EXPECT_THROW(booster::HybridParallelPlugin({.pp_size = 2}, world), ConfigError);
  EXPECT_THROW(booster::HybridParallelPlugin({.sp_size = 2}, world), ConfigError);
  EXPECT_THROW(booster::HybridParallelPlugin({.enable_sequence_parallelism = true}, world), ConfigError);
  EXPECT_THROW(booster::HybridParallelPlugin({.sequence_parallelism_mode = "ring"}, world), ConfigError);
  EXPECT_NO_THROW(booster::HybridParallelPlugin({.zero_stage = 1}, world));  // ZeRO composes with tp
  EXPECT_THROW(booster::HybridParallelPlugin({.zero_stage = 3}, world), ConfigError);
  EXPECT_THROW(booster::HybridParallelPlugin({.precision = "fp8"}, world), ConfigError);
  try {
    booster::HybridParallelPlugin({.pp_size = 2}, world);
  } catch (const ConfigError& e) {
    // A pipeline needs its microbatching named (the error suggests num_microbatches = 4).
    EXPECT_NE(std::string(e.what()).find("num_microbatches = 4"), std::string::npos) << e.what();
  }
}
