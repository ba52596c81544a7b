// The `colossus` binary: one subcommand per user task. Errors from the library
// become one readable line and a non-zero exit code.
#include "colossus/cli/commands.h"
#include "colossus/core/errors.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"Colossus: parallel training and inference of transformer models, in C++ on LibTorch"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("colossus ") + COLOSSUS_VERSION);
  std::vector<colossus::cli::Command> commands{
      colossus::cli::add_run_command(app), colossus::cli::add_rank_command(app),
      colossus::cli::add_check_command(app), colossus::cli::add_selftest_command(app),
      colossus::cli::add_generate_command(app), colossus::cli::add_train_command(app),
      colossus::cli::add_serve_command(app), colossus::cli::add_plan_command(app),
      colossus::cli::add_lora_command(app), colossus::cli::add_data_command(app)};
  // CLI11 reads a single-dash option as one letter: vLLM's `serve -tp N` is spelt out for it.
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 2; args.size() > 1 && args[1] == "serve" && i < args.size(); ++i) {
    if (args[i] == "-tp") args[i] = "--tensor_parallel_size";
    if (args[i].rfind("-tp=", 0) == 0) args[i] = "--tensor_parallel_size=" + args[i].substr(4);
  }
  std::vector<char*> arg_pointers;
  for (std::string& arg : args) arg_pointers.push_back(arg.data());
  try {
    app.parse(argc, arg_pointers.data());
  } catch (const CLI::ParseError& e) {
    // --help / --version exit 0; any usage error exits 2, like the subcommands' own checks.
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    for (auto& command : commands) {
      if (command.app->parsed()) return command.run();
    }
    return 2;
  } catch (const colossus::Error& e) {
    std::fprintf(stderr, "colossus: error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "colossus: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colossus: error: %s\n", e.what());
    return 1;
  }
}
