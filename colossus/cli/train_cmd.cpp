// `colossus train CONFIG.toml [--resume [auto|DIR]] [--section.key=value ...]`:
// trains the model a TOML config describes (see docs/training.md), on however
// many ranks `colossus run` (or torchrun/srun/mpirun) started.
#include "colossus/apps/trainer/config_schema.h"
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/trainer.h"
#include "colossus/cli/commands.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <iostream>

namespace colossus::cli {

namespace {

struct TrainArgs {
  std::string config_path;
  std::string resume;
  bool print_config = false;
  bool config_reference = false;
  std::vector<std::string> overrides;
};

int run_train(const TrainArgs& args) {
  if (args.config_reference) {
    std::cout << apps::config_reference_markdown();
    return 0;
  }
  if (args.config_path.empty()) throw ConfigError("colossus train: pass the training config (a TOML file)");
  auto config = apps::load_train_config(args.config_path, args.overrides);
  if (args.print_config) {
    std::cout << apps::effective_config_toml(config);
    return 0;
  }
  auto result = apps::train(config, {.resume = args.resume});
  return result.interrupted ? 130 : 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* sub = app.add_subcommand("train", "Train a model from a TOML config (run it under `colossus run -n N` for N ranks)");
  sub->footer(
      "Every key of the config can be overridden on the command line as --section.key=value, e.g.\n"
      "  colossus train examples/configs/gpt2_demo.toml --train.steps=200 --optimizer.lr=1e-3\n"
      "  colossus run -n 4 colossus train cfg.toml --plugin.bucket_cap_mb=10 --resume\n"
      "Sections: [model] [model.config] [data] [optimizer] [lr_scheduler] [plugin] [booster]\n"
      "[booster.loss_scaler] [train]; docs/config-reference.md lists every key with its type and default.");
  sub->add_option("config", args->config_path, "The training config (TOML)")->check(CLI::ExistingFile);
  auto* resume = sub->add_option("--resume", args->resume,
                                 "Continue from a checkpoint: no value or 'auto' = the output dir's latest, or a "
                                 "step/run directory")
                     ->expected(0, 1);
  sub->add_flag("--print_config,--print-config", args->print_config,
                "Print the effective config (every key, defaults filled in, overrides applied) as TOML, then exit");
  sub->add_flag("--config_reference", args->config_reference,
                "Print the reference of every config key (docs/config-reference.md) as Markdown, then exit");
  sub->allow_extras();
  return {sub, [args, sub, resume] {
            if (resume->count() > 0 && args->resume.empty()) args->resume = "auto";
            for (const auto& extra : sub->remaining()) {
              if (extra.rfind("--", 0) != 0 || extra.find('=') == std::string::npos ||
                  extra.find('.') > extra.find('=')) {
                throw ConfigError(fmt::format("unexpected argument '{}'; overrides look like --section.key=value "
                                              "(e.g. --train.steps=100)",
                                              extra));
              }
              args->overrides.push_back(extra.substr(2));
            }
            return run_train(*args);
          }};
}

}  // namespace colossus::cli
