// Lazy init under Gemini: a model built on the meta device, each rank
// materialising only its chunk shards (seeded init or a checkpoint), trains
// the eager curve bit for bit; each rank's shard equals the same slice of the
// eager full init; materialize() gives replicating plugins eager init; and
// the peak CPU bytes of building + wrapping a model
// (counting allocator) fall from the whole model to about 1/N of it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "colossus/booster/gemini_plugin.h"
#include "colossus/models/lazy_init.h"
#include "colossus/models/pretrained.h"
#include "tests/testing/counting_allocator.h"
#include "tests/testing/testing.h"
#include "tests/zero/zero_testing.h"

using namespace colossus;
using namespace colossus::zero::testing;
namespace ct = colossus::testing;
namespace bt = colossus::booster::testing;

namespace {

booster::GeminiPluginOptions small_chunks(models::ParamSource source = {}, double min_chunk_size_m = 0.001,
                                          double search_range_m = 0.004) {
  return {.gemini = {.precision = "fp32", .param_source = std::move(source)},
          .search_range_m = search_range_m,
          .min_chunk_size_m = min_chunk_size_m};
}

models::ModelConfig wider_gpt2() {  // ~3.3M parameters: well above allocator noise
  models::GPT2Config c;
  c.vocab_size = 1024;
  c.n_positions = 64;
  c.n_embd = 256;
  c.n_layer = 4;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
  return c;
}

}  // namespace

TEST(LazyInit, GeminiTrainsTheEagerCurveExactly) {
  for (const std::string model : {"gpt2", "llama"}) {
    const RunSpec eager{.model = model, .plugin = "gemini", .max_norm = 0.5};
    RunSpec lazy = eager;
    lazy.lazy_init = true;
    const auto expected = ZeroRun(eager).train(0, bt::kSteps);
    const auto got = ZeroRun(lazy).train(0, bt::kSteps);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << model << " step " << i;
  }
}

// The Booster materialises a lazy model for DDP (bf16: in bf16 directly, the
// fp32 masters read from the source) and ZeRO fills its buckets and master
// shards from the source: the eager curves, bit for bit.
TEST(LazyInit, DdpAndZeroTrainTheEagerCurveExactly) {
  const std::vector<RunSpec> specs = {
      {.model = "llama", .plugin = "ddp", .max_norm = 0.5, .precision = "fp32"},
      {.model = "llama", .plugin = "ddp", .max_norm = 0.5, .precision = "bf16"},
      {.model = "gpt2", .plugin = "zero", .stage = 1, .precision = "fp32"},
      {.model = "llama", .plugin = "zero", .stage = 2, .max_norm = 0.5, .precision = "bf16"},
  };
  for (const auto& eager : specs) {
    RunSpec lazy = eager;
    lazy.lazy_init = true;
    const auto expected = ZeroRun(eager).train(0, bt::kSteps);
    const auto got = ZeroRun(lazy).train(0, bt::kSteps);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], expected[i]) << eager.plugin << " " << eager.precision << " step " << i;
    }
  }
}

// Every parameter's owned part of every chunk is the same slice of the eager
// init, whatever the rank count: the source is per parameter, not per layout.
TEST(LazyInit, ShardIsTheSliceOfTheEagerInit) {
  const auto config = bt::tiny_llama();
  auto eager = models::create_model(config, {.seed = 11});
  auto lazy = models::create_lazy_model(config);
  std::vector<at::Tensor> expected;
  for (const auto& item : eager->named_parameters(/*recurse=*/true)) expected.push_back(item.value().detach().clone());
  zero::gemini::GeminiDDP ddp(lazy, ct::world(), c10::kCPU,
                              small_chunks(models::seeded_source(lazy, 11)).gemini_options());
  ASSERT_FALSE(models::is_lazy(*lazy));
  size_t checked = 0;
  for (const auto& chunk : ddp.chunks()) {
    for (size_t k : chunk.layout.params) {
      const auto& slot = ddp.layout().slots[k];
      if (slot.own_numel == 0) continue;
      EXPECT_TRUE(at::equal(chunk.shard.narrow(0, slot.own_offset, slot.own_numel),
                            zero::owned_part(expected[k].reshape({-1}), slot)))
          << ddp.params()[k].first;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
  // Whole again (gathered over the ranks), every parameter equals eager's.
  ddp.with_all_gathered([&] {
    for (size_t k = 0; k < ddp.params().size(); ++k) {
      EXPECT_TRUE(at::equal(ddp.params()[k].second, expected[k])) << ddp.params()[k].first;
    }
  });
}

// Replicating plugins (DDP) take the whole model: materialize() rebinds every
// meta parameter in place (modules and an optimizer built on the meta model
// see the real tensors) with eager init's values.
TEST(LazyInit, MaterializeWholeEqualsEagerInit) {
  const auto config = bt::tiny_gpt2();
  auto eager = models::create_model(config, {.seed = 9});
  auto lazy = models::create_lazy_model(config);
  const auto before = lazy->parameters();
  models::materialize(*lazy, models::seeded_source(lazy, 9));
  ASSERT_FALSE(models::is_lazy(*lazy));
  const auto after = lazy->parameters(), expected = eager->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(before[i].is_same(after[i]));
    EXPECT_TRUE(at::equal(after[i], expected[i]));
  }
  auto ids = bt::global_batch(config, 0);
  EXPECT_EQ(lazy->loss(lazy->forward(ids), ids).item<double>(), eager->loss(eager->forward(ids), ids).item<double>());
}

// Materialised straight from a checkpoint: the values are the file's.
TEST(LazyInit, MaterialisesFromACheckpoint) {
  bt::SharedScratch scratch("lazy_ckpt");
  const auto config = bt::tiny_gpt2();
  auto saved = models::create_model(config, {.seed = 5});
  if (ct::world()->rank() == 0) models::save_pretrained(*saved, scratch.path("model"));
  bt::barrier();
  auto lazy = models::create_lazy_model(config);
  zero::gemini::GeminiDDP ddp(lazy, ct::world(), c10::kCPU,
                              small_chunks(models::checkpoint_source(*lazy, scratch.path("model"))).gemini_options());
  const auto names = saved->named_parameters(/*recurse=*/true);
  ddp.with_all_gathered([&] {
    for (const auto& [name, p] : ddp.params()) EXPECT_TRUE(at::equal(p, names[name])) << name;
  });
  bt::barrier();
}

// Phi-3's files fuse q/k/v and gate/up: the source hands out the row ranges
// of the fused tensors (views of fresh mappings) for the model's parameters.
TEST(LazyInit, MaterialisesAFusedPhi3Checkpoint) {
  bt::SharedScratch scratch("lazy_phi3");
  const auto config = models::preset("phi3-tiny");
  auto saved = models::create_model(config, {.seed = 5});
  if (ct::world()->rank() == 0) models::save_pretrained(*saved, scratch.path("model"));
  bt::barrier();
  auto lazy = models::create_lazy_model(config);
  models::materialize(*lazy, models::checkpoint_source(*lazy, scratch.path("model")));
  const auto expected = saved->named_parameters(/*recurse=*/true);
  for (const auto& item : lazy->named_parameters(/*recurse=*/true)) {
    EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
  }
  bt::barrier();
}

// Peak CPU bytes while building the model and wrapping it in Gemini, less
// the gradient shards (not parameters): eager holds the whole model at once;
// lazy the rank's parameter shards, one chunk's staging and one parameter.
TEST(LazyInit, PeakParameterMemoryPerRankIsAboutOneOverN) {
  auto& counter = ct::counting_allocator();
  const auto config = wider_gpt2();
  const int n = ct::world()->size();
  int64_t model_bytes = 0, largest_param = 0;
  {
    auto probe = models::create_lazy_model(config);
    for (const auto& p : probe->parameters()) {
      model_bytes += p.numel() * 4;
      largest_param = std::max<int64_t>(largest_param, p.numel() * 4);
    }
  }
  struct Measured {
    int64_t param_peak = 0, shards = 0, chunk_shard = 0;
  };
  auto measure = [&](bool lazy) {
    bt::barrier();
    const int64_t base = counter.live();
    counter.reset_peak();
    Measured out;
    {
      auto model = lazy ? models::create_lazy_model(config) : models::create_model(config, {.seed = 3});
      // Chunks of ~0.25-0.75 Mi elements: the largest parameters (0.25 Mi)
      // fit with little padding.
      booster::GeminiPlugin plugin(
          small_chunks(lazy ? models::seeded_source(model, 3) : models::ParamSource(), 0.25, 0.5));
      auto wrapped = plugin.wrap_model(model);
      auto& ddp = dynamic_cast<booster::GeminiModel&>(*wrapped).ddp();
      const auto memory = ddp.memory_bytes();
      out.param_peak = counter.peak() - base - (memory.grads_host + memory.grads_device);
      out.shards = memory.params_device + memory.params_host;
      out.chunk_shard = ddp.chunks().front().layout.shard_numel * 4;
    }
    return out;
  };
  const Measured eager = measure(false), lazy = measure(true);
  if (ct::world()->rank() == 0) {
    std::printf(
        "model %.2f MiB, %d rank(s): peak parameter bytes building + wrapping, eager %.2f MiB (%.3f of the model), "
        "lazy %.2f MiB (%.3f; shards %.3f)\n",
        model_bytes / 1048576.0, n, eager.param_peak / 1048576.0, double(eager.param_peak) / model_bytes,
        lazy.param_peak / 1048576.0, double(lazy.param_peak) / model_bytes, double(lazy.shards) / model_bytes);
  }
  EXPECT_GE(eager.param_peak, model_bytes);
  // Chunk padding aside, each rank keeps 1/N of the parameters...
  EXPECT_LE(lazy.shards, model_bytes * 13 / 10 / n);
  // ...and never held more than that plus one chunk's staging and one parameter.
  EXPECT_LE(lazy.param_peak, lazy.shards + lazy.chunk_shard + largest_param + model_bytes / 50);
}
