#include "colossus/booster/memory_plan.h"

#include "colossus/core/errors.h"
#include "colossus/zero/gemini/placement.h"

#include <fmt/format.h>

#include <algorithm>

namespace colossus::booster {

namespace {

// Bytes per parameter (bf16 weights and gradients, fp32 masters and the two
// AdamW moments).
constexpr double kWeights = 2, kGrads = 2, kOptimizer = 12;
// The host step (HybridAdam with bf16 parameters and fp32 masters) keeps the
// reduced bf16 gradient on the host, not an fp32 copy.
constexpr double kHostStep = kOptimizer + 2;
// Gemini's host step with gradient accumulation also sums the micro-batches'
// gradients on the host in fp32.
constexpr double kHostStepAccumulating = kHostStep + 4;
// Gemini's NVMe tier: the moments (8 bytes) in files; the host keeps the fp32
// master and the fp32 gradient shard (measured: 8.4 bytes, bench/RESULTS.md).
constexpr double kNvmeHost = 8, kNvmeDisk = 8;
// Gemini's device chunks: bf16 parameter shard, fp32 gradient shard, fp32
// master and moments; the share of the device its auto policy lets chunks
// and activations use (GeminiOptions' default).
constexpr double kGeminiDevice = kWeights + 4 + kOptimizer;
constexpr double kSteadyCudaCapRatio = 0.9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

std::vector<MemoryPlanRow> plan_memory(const MemoryPlanInput& in) {
  for (const auto& [value, name] : {std::pair{in.parameters, "parameters"}, {in.layers, "layers"}, {in.hidden, "hidden"},
                                    {in.seq_len, "seq_len"}, {in.micro_batch, "micro_batch"}, {in.gpus, "gpus"},
                                    {in.grad_accum, "grad_accum"}}) {
    if (value < 1) throw ConfigError(fmt::format("plan --memory: {} = {} must be >= 1", name, value));
  }
  if (!(in.gpu_bytes > 0) || !(in.host_bytes > 0)) {
    throw ConfigError("plan --memory: the GPU and host memory must be known; pass --gpu-memory-gib and --host-memory-gib");
  }
  if (!(in.margin >= 0 && in.margin < 1)) {
    throw ConfigError(fmt::format("plan --memory: margin = {} must be in [0, 1)", in.margin));
  }
  const double p = static_cast<double>(in.parameters), n = static_cast<double>(in.gpus);
  const double sbh = static_cast<double>(in.seq_len) * static_cast<double>(in.micro_batch) * static_cast<double>(in.hidden);
  const double layers = static_cast<double>(in.layers);
  const double activations = 34.0 * sbh * layers;
  const double checkpointed = 2.0 * sbh * layers + 34.0 * sbh;
  struct Place {
    double device, host;  // per GPU; host for the whole machine
  };
  // Without and with checkpointing: only the auto policy's placement depends
  // on the activations it measures.
  struct Setting {
    const char* name;
    Place plain, checkpointed;
  };
  const auto fixed = [](const char* name, double device, double host) {
    return Setting{name, {device, host}, {device, host}};
  };
  // Gemini auto: parameter shards on the device, and optimizer shards there
  // while they fit in the margin the cap leaves after the parameters and the
  // activations (with the policy's headroom over them); the rest steps on
  // the host (zero/gemini/placement.h, gpu_margin_mem_ratio unset).
  const double gemini_host_step = in.grad_accum > 1 ? kHostStepAccumulating : kHostStep;
  const auto gemini_auto = [&](double non_model) {
    const double margin = std::max(
        0.0, kSteadyCudaCapRatio * in.gpu_bytes - (1.0 + zero::gemini::kNonModelHeadroom) * non_model - p * kWeights / n);
    const double optim = p * (kGeminiDevice - kWeights) / n;
    const double on_device = std::clamp(margin / optim, 0.0, 1.0);
    return Place{p * kWeights / n + on_device * optim, (1.0 - on_device) * p * gemini_host_step};
  };
  const std::vector<Setting> settings = {
      fixed("ddp", p * (kWeights + kGrads + kOptimizer), 0),
      fixed("low_level_zero stage = 1", p * (kWeights + kGrads) + p * kOptimizer / n, 0),
      fixed("low_level_zero stage = 2", p * kWeights + p * (kGrads + kOptimizer) / n, 0),
      // ZeRO-Offload: masters, moments and the reduced bf16 gradient on the host.
      fixed("low_level_zero stage = 2, cpu_offload = true", p * kWeights + p * kGrads / n, p * kHostStep),
      fixed("gemini placement_policy = \"static\"", p * kGeminiDevice / n, 0),
      // Gemini's host step: the device keeps the parameter shards (gradients
      // pass through two chunk buffers on their way down).
      fixed("gemini offload_optim_frac = 1.0", p * kWeights / n, p * gemini_host_step),
      {"gemini placement_policy = \"auto\"", gemini_auto(activations), gemini_auto(checkpointed)},
      fixed("gemini offload_optim_frac = 1.0, nvme_offload_fraction = 1.0", p * kWeights / n, p * kNvmeHost),
  };
  const double usable = in.gpu_bytes * (1.0 - in.margin);
  const double host_usable = in.host_bytes * (1.0 - in.margin);
  const auto fits = [&](const Place& place, double activation_bytes) {
    return place.host <= host_usable && place.device + activation_bytes <= usable;
  };
  std::vector<MemoryPlanRow> rows;
  for (const Setting& s : settings) {
    rows.push_back({.setting = s.name,
                    .model_states = s.plain.device,
                    .activations = activations,
                    .activations_checkpointed = checkpointed,
                    .host = s.plain.host,
                    .fits = fits(s.plain, activations),
                    .fits_checkpointed = fits(s.checkpointed, checkpointed)});
  }
  return rows;
}

std::string format_memory_plan(const MemoryPlanInput& in, const std::vector<MemoryPlanRow>& rows,
                               const std::string& model_name) {
  auto gib = [](double bytes) { return bytes / kGiB; };
  std::string out = fmt::format(
      "Memory plan: {} ({:.2f}B parameters, {} layers, hidden {}), seq_len {} x micro-batch {}, bf16 with fp32 "
      "masters, AdamW\nMachine: {} GPU(s) x {:.1f} GiB, host {:.1f} GiB; {:.0f}% of each kept free for buffers the "
      "estimate leaves out\n\n",
      model_name, static_cast<double>(in.parameters) / 1e9, in.layers, in.hidden, in.seq_len, in.micro_batch, in.gpus,
      gib(in.gpu_bytes), gib(in.host_bytes), 100 * in.margin);
  out += "| setting | model states / GPU | activations / GPU | + checkpointing | host (all ranks) | fits | fits with checkpointing |\n";
  out += "|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    out += fmt::format("| {} | {:.1f} GiB | {:.1f} GiB | {:.1f} GiB | {:.1f} GiB | {} | {} |\n", r.setting,
                       gib(r.model_states), gib(r.activations), gib(r.activations_checkpointed), gib(r.host),
                       r.fits ? "yes" : "no", r.fits_checkpointed ? "yes" : "no");
  }
  out += fmt::format(
      "\nModel states: 2 (bf16 weights) + 2 (gradients) + 12 (fp32 masters, AdamW moments) bytes per parameter, "
      "split over the GPUs as each setting shards them (Gemini's gradient shards are fp32: 18 bytes); offloaded "
      "optimizers step on the host with optimizer.name = \"hybrid_adam\", which keeps the bf16 gradient there (14 "
      "bytes per parameter; another optimizer keeps an fp32 copy: 16; Gemini with gradient accumulation also an fp32 "
      "sum: 18). Gemini auto puts optimizer shards on the GPU "
      "in what 90% of it leaves after parameters and activations (plus 10% of them), the rest on the host. The NVMe tier "
      "keeps the moments in files (8 bytes per parameter on disk: {:.1f} GiB here) and the fp32 master and gradient "
      "shard on the host. Activations: 34 x seq x batch x hidden bytes per layer, Megatron's "
      "count with dropout masks, an upper bound for our fused LLaMA blocks; checkpointing keeps 2 per layer plus "
      "one layer's rerun (model.gradient_checkpointing_ratio = 1). Measured on one H200 (bench/RESULTS.md "
      "gemini_capacity): plain bf16 AdamW trained 9.17B parameters at 138.5 GiB peak (estimate: 136.6 GiB of "
      "model states); Gemini with the optimizer offloaded used 14.3 host bytes per parameter (18.5 accumulating) "
      "on an H100, and the NVMe tier 8.4.\n",
      gib(kNvmeDisk * static_cast<double>(in.parameters)));
  return out;
}

}  // namespace colossus::booster
