// `colossus lora merge PATH OUT [--adapter DIR] [--dtype bf16]`: a LoRA
// adapter folded into its base model (PEFT's merge_and_unload) and written as
// a plain Hugging Face model directory, tokenizer and chat template included,
// that transformers, `colossus generate` and `colossus serve` load without
// LoRA. PATH is a model directory (with --adapter) or a LoRA training run's
// checkpoint (its adapter/ is found by itself). OUT appears whole or not at
// all: it is written beside itself and renamed into place.
#include "colossus/checkpoint/file_io.h"
#include "colossus/cli/commands.h"
#include "colossus/cli/inference_common.h"
#include "colossus/core/errors.h"
#include "colossus/inference/model_dir.h"
#include "colossus/lora/merged_model.h"
#include "colossus/models/pretrained.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>

namespace colossus::cli {

namespace {

namespace fs = std::filesystem;

struct LoraMergeArgs {
  std::string path;
  std::string out;
  std::string adapter;
  std::string dtype = "bf16";
};

int run_lora_merge(const LoraMergeArgs& args) {
  const std::string model_dir = inference::resolve_model_dir(args.path);
  if (fs::exists(args.out))
    throw ConfigError(fmt::format("lora merge: {} already exists; give a new directory", args.out));
  if (args.adapter.empty() && !lora::checkpoint_adapter_dir(model_dir))
    throw ConfigError(fmt::format("lora merge: {} is not a LoRA checkpoint (no adapter/ beside it); give the adapter "
                                  "with --adapter DIR",
                                  model_dir));
  auto model = load_inference_model(model_dir, args.adapter, {.dtype = parse_dtype(args.dtype)});
  const fs::path out = fs::path(args.out).lexically_normal();
  const fs::path staging = out.parent_path() / (out.filename().string() + ".partial");
  checkpoint::io::remove_tree(staging.string());
  models::save_pretrained(*model, staging.string());
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json"}) {
    if (fs::exists(fs::path(model_dir) / name)) fs::copy_file(fs::path(model_dir) / name, staging / name);
  }
  checkpoint::io::rename_file(staging.string(), out.string());
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  return 0;
}

}  // namespace

Command add_lora_command(CLI::App& app) {
  auto* lora = app.add_subcommand("lora", "LoRA adapters: merge one into its base model");
  lora->require_subcommand(1);
  auto args = std::make_shared<LoraMergeArgs>();
  auto* merge = lora->add_subcommand(
      "merge", "Fold a LoRA adapter into its base model and write a plain Hugging Face model directory");
  merge->footer(
      "Examples:\n"
      "  colossus lora merge runs/sft/checkpoints/latest merged/        (a LoRA training checkpoint)\n"
      "  colossus lora merge path/to/base merged/ --adapter path/to/peft-adapter");
  merge->add_option("PATH", args->path, "Base model directory, or a LoRA run's checkpoint step or checkpoints directory")
      ->required();
  merge->add_option("OUT", args->out, "New directory for the merged model")->required();
  merge->add_option("--adapter", args->adapter, "PEFT adapter directory (default: the checkpoint's adapter/)");
  merge->add_option("--dtype", args->dtype, "dtype of the merged weights")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  return {lora, [args] { return run_lora_merge(*args); }};
}

}  // namespace colossus::cli
