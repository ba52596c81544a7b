// `colossus plan --pp 4 --microbatches 8 [--chunks 2] [--model gpt2-124m |
// --layers 24 --hidden 1024] [--seq-len 1024] [--microbatch-size 1]`: the
// analytic bubble and activation memory of each pipeline schedule, and which
// pp_style to pick (parallel/pipeline/schedule_report.h). No ranks, no model
// weights: it only reads a preset or a config.json for the shapes.
#include "colossus/cli/commands.h"
#include "colossus/core/errors.h"
#include "colossus/models/config.h"
#include "colossus/parallel/pipeline/schedule_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace colossus::cli {

namespace {

struct PlanArgs {
  parallel::pipeline::ScheduleReportOptions report;
  std::string model;
  std::string dtype = "bf16";
};

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
  auto& o = args.report;
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

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* sub = app.add_subcommand(
      "plan", "Print each pipeline schedule's analytic bubble and activation memory, and which pp_style to pick");
  sub->footer(
      "Examples:\n"
      "  colossus plan --pp 4 --microbatches 8\n"
      "  colossus plan --pp 4 --microbatches 16 --chunks 2 --model gpt2-124m --seq-len 1024 --microbatch-size 4\n"
      "Bubble fractions assume equal forward, input-backward and weight-backward costs per stage; activations are\n"
      "estimated as 34*s*b*h bytes per layer at 2 bytes per element (Korthikanti et al. 2022).");
  auto& o = args->report;
  sub->add_option("--pp,--pp_size", o.pp_size, "Pipeline stages (pp_size)")->required();
  sub->add_option("--microbatches,--num_microbatches", o.num_microbatches, "Microbatches per step")->required();
  sub->add_option("--chunks,--num_model_chunks", o.num_model_chunks, "Model chunks per rank for interleaved")
      ->capture_default_str();
  sub->add_option("--model", args->model, "A preset (e.g. gpt2-124m) or a config.json / model directory");
  sub->add_option("--layers", o.num_layers, "Transformer blocks (overrides the model's)");
  sub->add_option("--hidden", o.hidden_size, "Hidden size (overrides the model's)");
  sub->add_option("--seq-len,--seq_len", o.seq_len, "Tokens per sequence (default: the model's context, else 1024)");
  sub->add_option("--microbatch-size,--microbatch_size", o.microbatch_size, "Sequences per microbatch")
      ->capture_default_str();
  sub->add_option("--dtype", args->dtype, "Activation dtype: bf16, fp16 or fp32")->capture_default_str();
  return {sub, [args] { return run_plan(*args); }};
}

}  // namespace colossus::cli
