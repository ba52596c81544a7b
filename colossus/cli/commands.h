// Each subcommand of the `colossus` binary registers itself on the CLI11 app
// and returns a function that runs it (returning the process exit code).
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace colossus::cli {

struct Command {
  CLI::App* app;            // the subcommand, as registered on the parent
  std::function<int()> run; // runs it after parsing; returns the exit code
};

Command add_run_command(CLI::App& app);       // colossus run
Command add_rank_command(CLI::App& app);      // colossus _rank (internal: per-rank wrapper under mpirun)
Command add_check_command(CLI::App& app);     // colossus check
Command add_selftest_command(CLI::App& app);  // colossus _selftest (internal: what check runs on each rank)
Command add_generate_command(CLI::App& app);  // colossus generate
Command add_serve_command(CLI::App& app);     // colossus serve
Command add_train_command(CLI::App& app);     // colossus train
Command add_plan_command(CLI::App& app);      // colossus plan
Command add_lora_command(CLI::App& app);      // colossus lora merge
Command add_data_command(CLI::App& app);      // colossus data prepare

}  // namespace colossus::cli
