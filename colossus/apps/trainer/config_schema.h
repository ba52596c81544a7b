// The keys of `colossus train`'s TOML config, listed once: each section's
// fields (name, type, one line of documentation, where it lands in
// TrainConfig; the default is what TrainConfig{} holds). The reader, the
// unknown-key error, `colossus train --print_config` and the generated
// docs/config-reference.md all come from these lists, so adding an option
// touches one place.
#pragma once
#include "colossus/apps/trainer/train_config.h"

#include <toml++/toml.h>

#include <string>

namespace colossus::apps {

// Every section of `root` read into a TrainConfig: types checked, unknown
// keys refused naming the section's valid keys (ConfigError).
TrainConfig read_config_tables(const toml::table& root);

// The effective config as TOML: every key of every section (for [plugin],
// the chosen plugin's), defaults filled in, overrides applied.
std::string effective_config_toml(const TrainConfig& config);

// docs/config-reference.md: every key with its type, default and one line.
std::string config_reference_markdown();

}  // namespace colossus::apps
