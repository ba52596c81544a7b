// Memory per rank of DDP, ZeRO-1, ZeRO-2, Gemini (ZeRO-3 chunks) and Gemini
// with full CPU offload on one model: bytes of the tensors each layout holds
// (parameters, gradients, fp32 masters, optimizer state) after one AdamW step,
// before zero_grad, split into device and host by the layout's placement, plus
// the process RSS. Run it under mpirun (scripts/bench_zero_memory.sh does 1, 2
// and 4 CPU ranks); rank 0 prints one JSON object.
//   bench_zero_memory --plugin ddp|zero1|zero2|gemini|gemini_offload [--precision fp32|bf16]
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/gemini_plugin.h"
#include "colossus/booster/low_level_zero_plugin.h"
#include "colossus/cluster/launch.h"
#include "colossus/metrics/memory.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>

using namespace colossus;

namespace {

// GPT-2 small-ish: 4 layers of width 256, vocabulary 8192 (~5.3M parameters).
models::ModelConfig bench_model() {
  models::GPT2Config c;
  c.vocab_size = 8192;
  c.n_positions = 128;
  c.n_embd = 256;
  c.n_layer = 4;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
  return c;
}

// Bytes of the distinct storages among `tensors` (views of one buffer count once).
int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto& storage = t.storage();
    if (seen.insert(storage.unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(storage.nbytes());
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string plugin_name = "ddp", precision = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--plugin")) plugin_name = argv[i + 1];
    if (!std::strcmp(argv[i], "--precision")) precision = argv[i + 1];
  }
  auto world = cluster::launch_from_env({.backend = "mpi"}).world;
  std::shared_ptr<booster::Plugin> plugin;
  booster::BoosterOptions booster_options;
  if (plugin_name == "ddp") {
    // Gradients as bucket views: DDP's leanest layout, one full gradient copy.
    plugin = std::make_shared<booster::DDPPlugin>(booster::DDPPluginOptions{.gradient_as_bucket_view = true}, world);
    booster_options.mixed_precision = precision;
  } else if (plugin_name == "gemini" || plugin_name == "gemini_offload") {
    const double offload = plugin_name == "gemini_offload" ? 1.0 : 0.0;
    plugin = std::make_shared<booster::GeminiPlugin>(
        booster::GeminiPluginOptions{
            .gemini = {.offload_optim_frac = offload, .offload_param_frac = offload, .precision = precision},
            .search_range_m = 1.0,
            .min_chunk_size_m = 0.25},
        world);
  } else {
    plugin = std::make_shared<booster::LowLevelZeroPlugin>(
        booster::LowLevelZeroPluginOptions{
            .stage = plugin_name == "zero1" ? 1 : 2, .precision = precision, .reduce_bucket_size_in_m = 1.0},
        world);
  }
  booster::Booster booster(plugin, booster_options);
  const auto config = bench_model();
  auto model = models::create_model(config, {.seed = 1});
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  auto optimizer = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-3});
  auto boosted = booster.boost(model, std::move(optimizer));
  const int64_t rows = 2;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(world->rank() + 1);
  auto ids = at::randint(8192, {rows, 128}, gen, at::kLong);
  auto& wrapped = *boosted.model;
  auto loss = wrapped.unwrap().loss(wrapped.forward(ids), ids);
  booster.backward(loss, *boosted.optimizer);
  boosted.optimizer->step();

  int64_t params = 0, grads = 0, masters = 0, state = 0, host = 0, gathered_peak = 0;
  if (auto* gemini = dynamic_cast<zero::gemini::GeminiOptimizer*>(boosted.optimizer.get())) {
    const auto bytes = gemini->memory_bytes();
    params = bytes.params_device + bytes.params_host;
    grads = bytes.grads_device + bytes.grads_host;
    masters = bytes.masters_device + bytes.masters_host;
    state = bytes.optim_device + bytes.optim_host;
    host = bytes.host_total();
    const auto& ddp = gemini->ddp();
    gathered_peak = ddp.max_gathered() * ddp.chunk_numel() * static_cast<int64_t>(c10::elementSize(
                                                                ddp.chunks().front().layout.dtype));
  } else if (auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(boosted.optimizer.get())) {
    const auto bytes = zero->memory_bytes();
    params = bytes.params;
    grads = bytes.grads;
    masters = bytes.masters;
    state = bytes.optimizer_state;
  } else {
    std::vector<at::Tensor> ps, gs;
    for (const auto& p : model->parameters()) {
      ps.push_back(p);
      gs.push_back(p.grad());
    }
    params = storage_bytes(ps);
    grads = storage_bytes(gs);
    if (auto* mixed = dynamic_cast<amp::MixedPrecisionOptimizer*>(boosted.optimizer.get())) {
      for (const auto& m : mixed->master_params()) {
        if (m.scalar_type() == at::kFloat && precision != "fp32") masters += m.nbytes();
      }
    }
    for (const auto& [name, t] : boosted.optimizer->state_dict().tensors) {
      if (name.rfind("state.", 0) == 0) state += t.nbytes();
    }
  }
  const int64_t rss = metrics::host_rss_bytes();
  // Largest per-rank figures (ranks differ by the padding of the last chunk).
  auto worst = at::tensor({params, grads, masters, state, rss, host, gathered_peak}, at::kLong);
  world->all_reduce(worst, cluster::ReduceOp::Max).wait();
  const auto* w = worst.data_ptr<int64_t>();
  if (world->rank() == 0) {
    std::printf(
        "{\"plugin\":\"%s\",\"precision\":\"%s\",\"ranks\":%d,\"model_params\":%lld,\"params_bytes\":%lld,"
        "\"grads_bytes\":%lld,\"masters_bytes\":%lld,\"optimizer_state_bytes\":%lld,\"rss_bytes\":%lld,"
        "\"host_bytes\":%lld,\"gathered_peak_bytes\":%lld}\n",
        plugin_name.c_str(), precision.c_str(), world->size(), static_cast<long long>(numel),
        static_cast<long long>(w[0]), static_cast<long long>(w[1]), static_cast<long long>(w[2]),
        static_cast<long long>(w[3]), static_cast<long long>(w[4]), static_cast<long long>(w[5]),
        static_cast<long long>(w[6]));
  }
  return 0;
}
