// A small trainer written against Colossus's installed C++ API: the walk-through
// in docs/cpp-api.md. Every rank joins the job, builds a tiny GPT-2, boosts it
// with ZeRO stage 2 (the low_level_zero plugin) and trains a few steps on the
// built-in corpus; rank 0 prints the loss averaged over ranks.
// Run: colossus run -n 2 ./tiny_trainer [DATA_DIR] [STEPS]
#include <colossus/booster/booster.h>
#include <colossus/booster/low_level_zero_plugin.h>
#include <colossus/cluster/coordinator.h>
#include <colossus/cluster/launch.h>
#include <colossus/cluster/logger.h>
#include <colossus/data/corpus.h>
#include <colossus/data/token_dataset.h>
#include <colossus/models/config.h>
#include <colossus/models/pretrained.h>
#include <colossus/optim/adam.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>

namespace cl = colossus;

namespace {

constexpr int64_t kSeqLen = 32;     // tokens a sample (the preset allows 64 positions)
constexpr int64_t kBatchSize = 4;   // samples a rank a step
constexpr uint64_t kSeed = 42;

// Rank 0 turns about 256 KB of the built-in corpus into token shards under
// data_dir/train (byte-level tokens: ids 0..255 and 256 = end of text) unless
// an earlier run did; the other ranks wait for it, then all read the shards.
std::shared_ptr<const cl::data::TokenDataset> tokenized_corpus(const std::string& data_dir,
                                                                const cl::cluster::DistCoordinator& coordinator) {
  if (coordinator.is_master() && !std::filesystem::exists(data_dir + "/train")) {
    auto tokenizer = cl::data::make_byte_tokenizer();
    cl::data::tokenize_to_shards(cl::data::builtin_corpus(kSeed, 256 * 1024), *tokenizer, data_dir);
  }
  coordinator.block_all();
  return std::make_shared<const cl::data::TokenDataset>(cl::data::TokenDataset::from_dir(data_dir + "/train", kSeqLen));
}

int train(const std::string& data_dir, int64_t steps) {
  // 1. Join the job: `colossus run` (or mpirun, torchrun, SLURM) set the
  //    variables; this makes the world process group (MPI on the CPU, NCCL on
  //    GPUs), picks the device and seeds every rank.
  const auto& cluster = cl::cluster::launch_from_env({.seed = kSeed});
  cl::cluster::DistCoordinator coordinator(cluster.world);
  cl::cluster::Logger log("tiny_trainer");
  log.info(fmt::format("{} ranks, backend {}, device {}", cluster.world->size(), cluster.backend, cluster.device.str()));

  // 2. A tiny GPT-2 from a preset, its vocabulary widened to the byte
  //    tokenizer's 257 ids (rounded up to a multiple of 64).
  auto config = std::get<cl::models::GPT2Config>(cl::models::preset("gpt2-tiny"));
  config.vocab_size = 320;
  auto model = cl::models::create_model(config, {.seed = kSeed});
  auto optimizer = std::make_unique<cl::optim::AdamW>(model->parameters(), cl::optim::AdamWOptions{.lr = 3e-3});

  // 3. The booster: ZeRO-2 shards optimizer state and gradients over the ranks.
  //    bf16 needs a GPU here; on the CPU the example trains in fp32.
  const bool on_gpu = cluster.device.is_cuda();
  auto plugin = std::make_shared<cl::booster::LowLevelZeroPlugin>(
      cl::booster::LowLevelZeroPluginOptions{.stage = 2, .precision = on_gpu ? "bf16" : "fp32", .max_norm = 1.0});
  cl::booster::Booster booster(plugin);

  // 4. The data: each rank reads its own 1/world of every shuffled epoch.
  auto loader = booster.prepare_dataloader(tokenized_corpus(data_dir, coordinator), {.batch_size = kBatchSize}, kSeed);
  auto boosted = booster.boost(model, std::move(optimizer), /*lr_scheduler=*/nullptr, loader);

  // 5. The loop. ids: (kBatchSize, kSeqLen) int64; the model shifts the labels
  //    itself, as Hugging Face's causal LMs do.
  double loss_value = 0.0;
  for (int64_t step = 1; step <= steps; ++step) {
    auto ids = boosted.dataloader->next().to(cluster.device);
    auto loss = boosted.model->forward_loss(ids, ids);
    booster.backward(loss, *boosted.optimizer);
    boosted.optimizer->step();
    boosted.optimizer->zero_grad();

    // The mean over ranks, for the log line (each rank saw different samples).
    loss_value = cluster.world->all_reduce_scalar(loss.item<double>(), cl::cluster::ReduceOp::Avg);
    log.info(fmt::format("step {}/{} loss {:.4f}", step, steps, loss_value));
  }
  cl::cluster::finalize();
  // A diverged run is a failure the caller should see in the exit code.
  return std::isfinite(loss_value) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string data_dir = argc > 1 ? argv[1] : "tiny_trainer_data";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 20;
  try {
    return train(data_dir, steps);
  } catch (const std::exception& e) {
    // Colossus's errors (ConfigError, DistError, ...) say what was wrong and how to fix it.
    fmt::print(stderr, "tiny_trainer: {}\n", e.what());
    return 1;
  }
}
