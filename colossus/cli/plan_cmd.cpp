// `colossus plan --pp 4 --microbatches 8 [--chunks 2] [--model gpt2-124m |
// --layers 24 --hidden 1024] [--seq-len 1024] [--microbatch-size 1]`: the
// analytic bubble and activation memory of each pipeline schedule, and which
// pp_style to pick (parallel/pipeline/schedule_report.h). `colossus plan
// --memory --model M [--gpus N --gpu-memory-gib G --host-memory-gib H]`: what
// each plugin and offload setting keeps per GPU and on the host, and whether
// it fits this machine (booster/memory_plan.h). No ranks, no model weights:
// it only reads a preset or a config.json for the shapes.
#include "colossus/booster/memory_plan.h"
#include "colossus/cli/commands.h"
#include "colossus/core/accelerator.h"
#include "colossus/core/errors.h"
#include "colossus/models/config.h"
#include "colossus/models/pretrained.h"
#include "colossus/parallel/pipeline/schedule_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace colossus::cli {

namespace {

struct PlanArgs {
  parallel::pipeline::ScheduleReportOptions report;
  std::string model;
  std::string dtype = "bf16";
  bool memory = false;
  int64_t gpus = 0;             // 0: the GPUs this machine has (1 without any)
  double gpu_memory_gib = 0;    // 0: probed
  double host_memory_gib = 0;   // 0: /proc/meminfo
  double margin = 0.05;
  int64_t grad_accum = 1;
  CLI::Option* pp_option = nullptr;
  CLI::Option* microbatches_option = nullptr;
};

// MemTotal of /proc/meminfo in bytes; 0 when it cannot be read.
double host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024.0;
  }
  return 0;
}

int run_memory_plan(const PlanArgs& args);

// A preset name, a config.json, or a directory holding one.
models::ModelConfig resolve_model(const std::string& model) {
  const auto names = models::preset_names();
  if (std::find(names.begin(), names.end(), model) != names.end()) return models::preset(model);
  std::filesystem::path path(model);
  if (std::filesystem::is_directory(path)) path /= "config.json";
  if (!std::filesystem::exists(path)) {
    throw ConfigError(fmt::format("plan: --model '{}' is neither a preset ({}) nor a config.json or model directory",
                                  model, fmt::join(names, ", ")));
  }
  return models::read_config(path.string());
}

int64_t context_length(const models::ModelConfig& config) {
  return std::visit(
      [](const auto& c) -> int64_t {
        if constexpr (requires { c.n_positions; }) {
          return c.n_positions;
        } else {
          return c.max_position_embeddings;
        }
      },
      config);
}

int run_plan(PlanArgs args) {
  if (args.memory) return run_memory_plan(args);
  auto& o = args.report;
  if (args.pp_option->count() == 0 || args.microbatches_option->count() == 0) {
    throw ConfigError("plan: --pp and --microbatches are required for a pipeline plan (or --memory for a memory plan)");
  }
  if (args.dtype == "bf16" || args.dtype == "fp16") {
    o.activation_bytes = 2;
  } else if (args.dtype == "fp32") {
    o.activation_bytes = 4;
  } else {
    throw ConfigError(fmt::format("plan: --dtype {}; use bf16, fp16 or fp32", args.dtype));
  }
  if (!args.model.empty()) {
    const auto config = resolve_model(args.model);
    if (o.num_layers == 0) o.num_layers = models::num_layers(config);
    if (o.hidden_size == 0) o.hidden_size = models::hidden_size(config);
    if (o.seq_len == 0) o.seq_len = context_length(config);
  } else if ((o.num_layers > 0 || o.hidden_size > 0) && o.seq_len == 0) {
    o.seq_len = 1024;
  }
  std::cout << parallel::pipeline::format_plan(o, parallel::pipeline::plan_pipeline(o));
  return 0;
}

int run_memory_plan(const PlanArgs& args) {
  if (args.model.empty()) {
    throw ConfigError("plan --memory: --model is required (a preset such as llama-1b-like, or a config.json / model "
                      "directory)");
  }
  const auto config = resolve_model(args.model);
  booster::MemoryPlanInput in;
  // Counted on the meta device: nothing is allocated; tied embeddings once.
  auto meta = models::create_model(config, {.device = c10::kMeta, .init = false});
  for (const auto& p : meta->parameters()) in.parameters += p.numel();
  in.layers = args.report.num_layers > 0 ? args.report.num_layers : models::num_layers(config);
  in.hidden = args.report.hidden_size > 0 ? args.report.hidden_size : models::hidden_size(config);
  in.seq_len = args.report.seq_len > 0 ? args.report.seq_len : context_length(config);
  in.micro_batch = args.report.microbatch_size;
  const auto accelerator = probe_accelerator();
  const int64_t probed_gpus = accelerator ? static_cast<int64_t>(accelerator->devices.size()) : 0;
  in.gpus = args.gpus > 0 ? args.gpus : std::max<int64_t>(1, probed_gpus);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  in.gpu_bytes = args.gpu_memory_gib > 0 ? args.gpu_memory_gib * kGiB
                 : probed_gpus > 0      ? static_cast<double>(accelerator->devices[0].total_bytes)
                                        : 0;
  in.host_bytes = args.host_memory_gib > 0 ? args.host_memory_gib * kGiB : host_memory_bytes();
  if (in.gpu_bytes <= 0) {
    throw ConfigError("plan --memory: this machine has no GPU to probe; pass --gpu-memory-gib (e.g. 139.8 for an H200, "
                      "79.1 for an H100) and --gpus");
  }
  in.margin = args.margin;
  in.grad_accum = args.grad_accum;
  std::cout << booster::format_memory_plan(in, booster::plan_memory(in), args.model);
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* sub = app.add_subcommand(
      "plan",
      "Print each pipeline schedule's analytic bubble and activation memory, and which pp_style to pick; with "
      "--memory, what each plugin and offload setting keeps per GPU and on the host, and what fits");
  sub->footer(
      "Examples:\n"
      "  colossus plan --pp 4 --microbatches 8\n"
      "  colossus plan --pp 4 --microbatches 16 --chunks 2 --model gpt2-124m --seq-len 1024 --microbatch-size 4\n"
      "  colossus plan --memory --model llama-1b-like --seq-len 2048 --microbatch-size 8 --gpus 8 --gpu-memory-gib 79.1\n"
      "Bubble fractions assume equal forward, input-backward and weight-backward costs per stage; activations are\n"
      "estimated as 34*s*b*h bytes per layer at 2 bytes per element (Korthikanti et al. 2022).");
  auto& o = args->report;
  args->pp_option = sub->add_option("--pp,--pp_size", o.pp_size, "Pipeline stages (pp_size); required without --memory");
  args->microbatches_option = sub->add_option("--microbatches,--num_microbatches", o.num_microbatches,
                                              "Microbatches per step; required without --memory");
  sub->add_option("--chunks,--num_model_chunks", o.num_model_chunks, "Model chunks per rank for interleaved")
      ->capture_default_str();
  sub->add_option("--model", args->model, "A preset (e.g. gpt2-124m) or a config.json / model directory");
  sub->add_option("--layers", o.num_layers, "Transformer blocks (overrides the model's)");
  sub->add_option("--hidden", o.hidden_size, "Hidden size (overrides the model's)");
  sub->add_option("--seq-len,--seq_len", o.seq_len, "Tokens per sequence (default: the model's context, else 1024)");
  sub->add_option("--microbatch-size,--microbatch_size", o.microbatch_size, "Sequences per microbatch")
      ->capture_default_str();
  sub->add_option("--dtype", args->dtype, "Activation dtype: bf16, fp16 or fp32")->capture_default_str();
  sub->add_flag("--memory", args->memory,
                "Memory plan: model states and activations per GPU and host memory for each plugin setting");
  sub->add_option("--gpus", args->gpus, "--memory: data-parallel GPUs (default: this machine's, else 1)");
  sub->add_option("--gpu-memory-gib,--gpu_memory_gib", args->gpu_memory_gib,
                  "--memory: memory of one GPU in GiB (default: probed)");
  sub->add_option("--host-memory-gib,--host_memory_gib", args->host_memory_gib,
                  "--memory: host memory in GiB (default: /proc/meminfo)");
  sub->add_option("--margin", args->margin, "--memory: share of GPU and host memory kept free")->capture_default_str();
  sub->add_option("--grad-accum,--grad_accum", args->grad_accum, "--memory: micro-batches a step (train.grad_accum)")
      ->capture_default_str();
  return {sub, [args] { return run_plan(*args); }};
}

}  // namespace colossus::cli
