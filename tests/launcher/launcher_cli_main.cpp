// A `colossus` binary with only `run` and `_rank`, so the launcher's process
// tests do not depend on every other subcommand linking. It handles errors as
// colossus/cli/main.cpp does.
#include "colossus/cli/commands.h"
#include "colossus/core/errors.h"

#include <cstdio>
#include <exception>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"colossus (launcher subcommands only)"};
  app.require_subcommand(1);
  std::vector<colossus::cli::Command> commands{colossus::cli::add_run_command(app),
                                               colossus::cli::add_rank_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& command : commands) {
      if (command.app->parsed()) return command.run();
    }
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colossus: error: %s\n", e.what());
    return 1;
  }
}
