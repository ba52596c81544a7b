// Host memory per rank while loading a Hugging Face checkpoint through each
// plugin: the peak RSS growth of building + boosting the model against what
// the rank keeps afterwards (its RSS growth once loading is done, i.e. the
// tp slices / pipeline stage / ZeRO buckets and master shards / Gemini chunks
// it holds), with the parameter and master bytes of its tensors beside it.
// Loading is lazy (a meta model, models::checkpoint_source: mapped, each
// rank reads only what its plugin keeps); --eager loads the whole model on
// every rank first, as transformers' from_pretrained does, for comparison.
// Run under mpirun (scripts/bench_load_memory.sh); rank 0 prints one JSON row.
//   bench_load_memory --make DIR [--preset llama-1b-like]      one process: writes a bf16 checkpoint
//   bench_load_memory --checkpoint DIR --plugin ddp|zero2|gemini|tp|pp [--precision bf16|fp32] [--eager]
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/gemini_plugin.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/booster/low_level_zero_plugin.h"
#include "colossus/cluster/launch.h"
#include "colossus/metrics/memory.h"
#include "colossus/models/config.h"
#include "colossus/models/lazy_init.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"

#include <ATen/ATen.h>
#include <malloc.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>

using namespace colossus;

namespace {

int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || t.is_meta()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

// Resident bytes once freed memory has gone back to the kernel.
int64_t settled_rss() {
  ::malloc_trim(0);
  return metrics::host_rss_bytes();
}

std::shared_ptr<booster::Plugin> make_plugin(const std::string& name, const std::string& precision,
                                             cluster::ProcessGroupPtr world, booster::BoosterOptions& booster_options) {
  const int n = world->size();
  if (name == "ddp") {
    booster_options.mixed_precision = precision;
    return std::make_shared<booster::DDPPlugin>(booster::DDPPluginOptions{}, world);
  }
  if (name == "zero2") {
    return std::make_shared<booster::LowLevelZeroPlugin>(
        booster::LowLevelZeroPluginOptions{.stage = 2, .precision = precision}, world);
  }
  if (name == "gemini") {
    return std::make_shared<booster::GeminiPlugin>(booster::GeminiPluginOptions{.gemini = {.precision = precision}},
                                                   world);
  }
  if (name == "tp") return std::make_shared<booster::HybridParallelPlugin>(
      booster::HybridParallelPluginOptions{.tp_size = n, .precision = precision}, world);
  if (name == "pp") return std::make_shared<booster::HybridParallelPlugin>(
      booster::HybridParallelPluginOptions{.pp_size = n, .num_microbatches = n, .precision = precision}, world);
  throw std::invalid_argument("--plugin " + name + " is not one of ddp, zero2, gemini, tp, pp");
}

}  // namespace

int main(int argc, char** argv) {
  std::string make_dir, checkpoint, plugin_name = "ddp", precision = "bf16", preset = "llama-1b-like";
  bool eager = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--make") make_dir = value();
    else if (arg == "--checkpoint") checkpoint = value();
    else if (arg == "--plugin") plugin_name = value();
    else if (arg == "--precision") precision = value();
    else if (arg == "--preset") preset = value();
    else if (arg == "--eager") eager = true;
    else throw std::invalid_argument("unknown argument " + arg);
  }
  if (!make_dir.empty()) {
    auto model = models::create_model(models::preset(preset), {.seed = 1, .dtype = at::kBFloat16});
    models::save_pretrained(*model, make_dir);
    return 0;
  }
  auto world = cluster::launch_from_env({.backend = "mpi"}).world;
  const int64_t baseline = settled_rss();
  int64_t params_bytes = 0, masters_bytes = 0, numel = 0;
  {
    booster::BoosterOptions booster_options;
    auto plugin = make_plugin(plugin_name, precision, world, booster_options);
    booster::Booster booster(plugin, booster_options);
    std::shared_ptr<models::CausalLM> model;
    models::ParamSource source;
    if (eager) {
      model = models::load_pretrained(checkpoint);
    } else {
      model = models::create_lazy_model(models::read_config((std::filesystem::path(checkpoint) / "config.json").string()));
      source = models::checkpoint_source(*model, checkpoint);
    }
    for (const auto& p : model->parameters()) numel += p.numel();
    auto optimizer = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-4});
    auto boosted = booster.boost(model, std::move(optimizer), nullptr, nullptr, source);
    params_bytes = storage_bytes(boosted.model->unwrap().parameters());
    if (auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(boosted.optimizer.get())) {
      params_bytes = zero->memory_bytes().params;
      masters_bytes = zero->memory_bytes().masters;
    } else if (auto* gemini = dynamic_cast<zero::gemini::GeminiOptimizer*>(boosted.optimizer.get())) {
      const auto bytes = gemini->memory_bytes();
      params_bytes = bytes.params_device + bytes.params_host;
      masters_bytes = bytes.masters_device + bytes.masters_host;
    } else if (auto* mixed = dynamic_cast<amp::MixedPrecisionOptimizer*>(boosted.optimizer.get())) {
      masters_bytes = storage_bytes(mixed->master_params());
    } else {
      // HybridParallelPlugin wraps its masters inside clipping; count the fp32
      // tensors the optimizer steps that are not the parameters themselves.
      std::set<const void*> own;
      for (const auto& p : boosted.model->unwrap().parameters()) own.insert(p.storage().unsafeGetStorageImpl());
      std::vector<at::Tensor> stepped;
      for (const auto& group : boosted.optimizer->param_groups()) {
        for (const auto& p : group.params) {
          if (!own.contains(p.storage().unsafeGetStorageImpl())) stepped.push_back(p);
        }
      }
      masters_bytes = storage_bytes(stepped);
    }
    const int64_t kept = settled_rss() - baseline;
    const int64_t peak = metrics::host_peak_rss_bytes() - baseline;
    // Per rank, then the worst rank of each figure.
    auto figures = at::tensor({peak, kept, params_bytes, masters_bytes}, at::kLong);
    auto worst = figures.clone();
    world->all_reduce(worst, cluster::ReduceOp::Max).wait();
    auto ratio = at::tensor({static_cast<double>(peak) / static_cast<double>(std::max<int64_t>(kept, 1))}, at::kDouble);
    world->all_reduce(ratio, cluster::ReduceOp::Max).wait();
    const auto* w = worst.data_ptr<int64_t>();
    if (world->rank() == 0) {
      std::printf(
          "{\"plugin\":\"%s\",\"precision\":\"%s\",\"ranks\":%d,\"eager\":%s,\"model_params\":%lld,"
          "\"peak_bytes\":%lld,\"kept_bytes\":%lld,\"params_bytes\":%lld,\"masters_bytes\":%lld,"
          "\"peak_over_kept\":%.4f}\n",
          plugin_name.c_str(), precision.c_str(), world->size(), eager ? "true" : "false",
          static_cast<long long>(numel), static_cast<long long>(w[0]), static_cast<long long>(w[1]),
          static_cast<long long>(w[2]), static_cast<long long>(w[3]), ratio.item<double>());
    }
  }
  return 0;
}
