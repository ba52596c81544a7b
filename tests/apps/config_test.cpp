// The training config: TOML sections map onto the option structs, overrides
// apply over the file, and every mistake is a ConfigError naming the key.
#include "colossus/apps/trainer/config_schema.h"
#include "colossus/apps/trainer/train_config.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

using colossus::ConfigError;
using colossus::apps::parse_train_config;

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_train_config(text, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(TrainConfig, SectionsMapOntoOptionStructs) {
  auto c = parse_train_config(R"(
[model]
preset = "llama-tiny"
[model.config]
num_hidden_layers = 3
rope_theta = 500000.0
[data]
seq_len = 64
batch_size = 2
[optimizer]
name = "lamb"
lr = 1e-3
[lr_scheduler]
name = "linear"
warmup_steps = 5
[plugin]
name = "ddp"
bucket_cap_mb = 4.5
gradient_as_bucket_view = true
[booster]
mixed_precision = "fp16"
max_norm = 1.0
norm_type = "inf"
[booster.loss_scaler]
initial_scale = 1024.0
hysteresis = 3
[train]
steps = 7
grad_accum = 2
output_dir = "/tmp/x"
)");
  EXPECT_EQ(c.model.preset, "llama-tiny");
  EXPECT_EQ(c.model.config.at("num_hidden_layers"), "3");
  EXPECT_EQ(c.data.seq_len, 64);
  EXPECT_EQ(c.optimizer.name, "lamb");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 5);
  EXPECT_DOUBLE_EQ(c.plugin.ddp.bucket_cap_mb, 4.5);
  EXPECT_TRUE(c.plugin.ddp.gradient_as_bucket_view);
  EXPECT_EQ(c.booster.mixed_precision, "fp16");
  EXPECT_TRUE(std::isinf(c.booster.norm_type));
  EXPECT_DOUBLE_EQ(c.booster.loss_scaler.initial_scale, 1024.0);
  EXPECT_EQ(c.booster.loss_scaler.hysteresis, 3);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.grad_accum, 2);
}

TEST(TrainConfig, OverridesApplyOverTheFile) {
  auto c = parse_train_config("[train]\nsteps = 5\n",
                              {"train.steps=9", "optimizer.lr=0.01", "train.output_dir=runs/b", "model.config.n_layer=3",
                               "data.shuffle=false"});
  EXPECT_EQ(c.train.steps, 9);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_EQ(c.train.output_dir, "runs/b");  // a bare word is a string
  EXPECT_EQ(c.model.config.at("n_layer"), "3");
  EXPECT_FALSE(c.data.shuffle);
  // The saved text carries the overrides, so the run directory says what ran.
  EXPECT_NE(c.toml_text.find("steps = 9"), std::string::npos);
}

TEST(TrainConfig, MistakesNameTheKey) {
  EXPECT_NE(error_of("[train]\nstep = 5\n").find("unknown key 'train.step'"), std::string::npos);
  EXPECT_NE(error_of("[train]\nsteps = \"5\"\n").find("train.steps is a string"), std::string::npos);
  EXPECT_NE(error_of("[trian]\nsteps = 5\n").find("unknown key '.trian'"), std::string::npos);
  EXPECT_NE(error_of("[train]\nsteps = 0\n").find("train.steps = 0"), std::string::npos);
  EXPECT_NE(error_of("[optimizer]\nname = \"adam_w\"\n").find("adamw"), std::string::npos);
  EXPECT_NE(error_of("[plugin]\nname = \"zero9\"\n").find("plugin.name = 'zero9'"), std::string::npos);
  EXPECT_NE(error_of("[booster]\nmixed_precision = \"fp8\"\n").find("fp8"), std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"gpt5\"\n").find("gpt2-124m"), std::string::npos);
  EXPECT_NE(error_of("[train\n").find("config:1"), std::string::npos);
  EXPECT_NE(error_of("", {"train.steps"}).find("section.key=value"), std::string::npos);
  EXPECT_NE(error_of("", {"train.steps=-3"}).find("train.steps = -3"), std::string::npos);
}

// Without data.tokenizer a pretrained model brings its own tokenizer; one
// without tokenizer files is refused rather than trained on byte tokens.
TEST(TrainConfig, TokenizerDefaultsToThePretrainedModels) {
  EXPECT_EQ(parse_train_config("").data.tokenizer, "byte");
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("colossus_tok_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string pretrained = fmt::format("[model]\npretrained = '{}'\n", dir.string());
  EXPECT_NE(error_of(pretrained).find("set data.tokenizer"), std::string::npos) << error_of(pretrained);
  std::ofstream(dir / "tokenizer.json") << "{}";
  EXPECT_EQ(parse_train_config(pretrained).data.tokenizer, dir.string());
  EXPECT_EQ(parse_train_config(pretrained + "[data]\ntokenizer = 'byte'\n").data.tokenizer, "byte");
  std::filesystem::remove_all(dir);
}

TEST(TrainConfig, MaxNonfiniteSteps) {
  EXPECT_EQ(parse_train_config("").train.max_nonfinite_steps, 3);
  EXPECT_EQ(parse_train_config("[train]\nmax_nonfinite_steps = 10\n").train.max_nonfinite_steps, 10);
  EXPECT_NE(error_of("[train]\nmax_nonfinite_steps = 0\n").find("train.max_nonfinite_steps = 0"), std::string::npos);
}

TEST(TrainConfig, HybridParallelKeysMapOntoItsOptions) {
  auto c = parse_train_config(R"(
[plugin]
name = "hybrid_parallel"
tp_size = 2
precision = "bf16"
max_norm = 1.0
initial_scale = 1024.0
parallel_output = false
make_vocab_size_divisible_by = 128
dp_outside = false
)");
  EXPECT_EQ(c.plugin.name, "hybrid_parallel");
  EXPECT_EQ(c.plugin.hybrid_parallel.tp_size, 2);
  EXPECT_EQ(c.plugin.hybrid_parallel.precision, "bf16");
  EXPECT_EQ(c.plugin.hybrid_parallel.max_norm, 1.0);
  EXPECT_EQ(c.plugin.hybrid_parallel.loss_scaler.initial_scale, 1024.0);
  EXPECT_FALSE(c.plugin.hybrid_parallel.parallel_output);
  EXPECT_EQ(c.plugin.hybrid_parallel.make_vocab_size_divisible_by, 128);
  EXPECT_FALSE(c.plugin.hybrid_parallel.dp_outside);
  // The pipeline keys.
  auto pp = parse_train_config(
      "[plugin]\nname = \"hybrid_parallel\"\npp_size = 2\npp_style = \"interleaved\"\nnum_model_chunks = 2\n"
      "num_microbatches = 4\noverlap_p2p = false\n");
  EXPECT_EQ(pp.plugin.hybrid_parallel.pp_size, 2);
  EXPECT_EQ(pp.plugin.hybrid_parallel.pp_style, "interleaved");
  EXPECT_EQ(pp.plugin.hybrid_parallel.num_model_chunks, 2);
  EXPECT_EQ(pp.plugin.hybrid_parallel.num_microbatches, 4);
  EXPECT_FALSE(pp.plugin.hybrid_parallel.overlap_p2p);
  // Not landed yet: refused with the reason, before anything is allocated.
  EXPECT_NE(error_of("[plugin]\nname = \"hybrid_parallel\"\nsp_size = 2\n").find("sequence parallelism"),
            std::string::npos);
  EXPECT_NE(error_of("[plugin]\nname = \"hybrid_parallel\"\n[booster]\nmax_norm = 1.0\n").find("plugin.max_norm"),
            std::string::npos);
}

// The sequence-parallel keys, all four modes' shapes: split_gather / ring on
// the tp group, ring_attn with two-level rings; bad combinations are refused
// while parsing, naming the key.
TEST(TrainConfig, HybridParallelSequenceParallelKeys) {
  auto c = parse_train_config(R"(
[plugin]
name = "hybrid_parallel"
tp_size = 2
enable_sequence_parallelism = true
sequence_parallelism_mode = "split_gather"
)");
  EXPECT_EQ(c.plugin.hybrid_parallel.tp_size, 2);
  EXPECT_TRUE(c.plugin.hybrid_parallel.enable_sequence_parallelism);
  EXPECT_EQ(c.plugin.hybrid_parallel.sequence_parallelism_mode, "split_gather");
  EXPECT_TRUE(c.plugin.hybrid_parallel.sequence_over_tp());
  c = parse_train_config(R"(
[plugin]
name = "hybrid_parallel"
sp_size = 4
enable_sequence_parallelism = true
sequence_parallelism_mode = "ring_attn"
inner_ring_size = 2
)");
  EXPECT_EQ(c.plugin.hybrid_parallel.sp_size, 4);
  EXPECT_EQ(c.plugin.hybrid_parallel.inner_ring_size, 2);
  EXPECT_FALSE(c.plugin.hybrid_parallel.sequence_over_tp());
  const std::string sp = "[plugin]\nname = \"hybrid_parallel\"\nenable_sequence_parallelism = true\n";
  EXPECT_NE(error_of(sp + "sequence_parallelism_mode = \"ring\"\n").find("tp_size > 1"), std::string::npos);
  EXPECT_NE(error_of(sp + "sequence_parallelism_mode = \"ring_attn\"\nsp_size = 4\ninner_ring_size = 3\n")
                .find("inner_ring_size = 3"),
            std::string::npos);
  EXPECT_NE(error_of(sp + "sequence_parallelism_mode = \"split_gather\"\ntp_size = 2\nsp_size = 4\n").find("sp_size = 4"),
            std::string::npos);
  EXPECT_NE(error_of(sp + "sequence_parallelism_mode = \"rings\"\n").find("'rings' is unknown"), std::string::npos);
}

TEST(TrainConfig, GeminiKeysMapOntoItsOptions) {
  auto c = parse_train_config(R"(
[plugin]
name = "gemini"
placement_policy = "static"
shard_param_frac = 0.5
offload_optim_frac = 1.0
precision = "fp32"
pin_memory = true
max_prefetch = 2
enable_gradient_accumulation = true
search_range_m = 8.0
min_chunk_size_m = 4.0
hidden_dim = 768
max_norm = 1.0
nvme_offload_fraction = 0.5
nvme_offload_dir = "/tmp/nvme"
lazy_init = true
[train]
grad_accum = 2
)");
  const auto& g = c.plugin.gemini.gemini;
  EXPECT_EQ(c.plugin.name, "gemini");
  EXPECT_EQ(g.shard_param_frac, 0.5);
  EXPECT_EQ(g.offload_optim_frac, 1.0);
  EXPECT_EQ(g.precision, "fp32");
  EXPECT_TRUE(g.pin_memory);
  EXPECT_EQ(g.max_prefetch, 2);
  EXPECT_TRUE(g.enable_gradient_accumulation);
  EXPECT_EQ(c.plugin.gemini.search_range_m, 8.0);
  EXPECT_EQ(c.plugin.gemini.min_chunk_size_m, 4.0);
  EXPECT_EQ(c.plugin.gemini.hidden_dim, 768);
  EXPECT_EQ(g.max_norm, 1.0);
  EXPECT_EQ(g.nvme_offload_fraction, 0.5);
  EXPECT_EQ(g.nvme_offload_dir, "/tmp/nvme");
  EXPECT_TRUE(c.plugin.lazy_init);
  const std::string gemini = "[plugin]\nname = \"gemini\"\n";
  // gpu_margin_mem_ratio: "measured" (unset) by default, or a number.
  EXPECT_FALSE(g.gpu_margin_mem_ratio.has_value());
  const std::string auto_policy = gemini + "placement_policy = \"auto\"\n";
  EXPECT_EQ(parse_train_config(auto_policy + "gpu_margin_mem_ratio = 0.25\n").plugin.gemini.gemini.gpu_margin_mem_ratio,
            0.25);
  EXPECT_FALSE(parse_train_config(auto_policy + "gpu_margin_mem_ratio = \"measured\"\n")
                   .plugin.gemini.gemini.gpu_margin_mem_ratio.has_value());
  EXPECT_NE(error_of(auto_policy + "gpu_margin_mem_ratio = \"half\"\n").find("a number or \"measured\""),
            std::string::npos);
  EXPECT_NE(error_of(gemini + "gpu_margin_mem_ratio = 0.5\n").find("only applies to placement_policy='auto'"),
            std::string::npos);
  EXPECT_NE(error_of(gemini + "placement_policy = \"auto\"\noffload_optim_frac = 1.0\n").find("only apply"),
            std::string::npos);
  EXPECT_NE(error_of(gemini + "stage = 3\n").find("stage"), std::string::npos);
  EXPECT_NE(error_of(gemini + "offload_optim_frac = 1.0\nnvme_offload_fraction = 0.5\n").find("nvme_offload_dir"),
            std::string::npos);
  EXPECT_NE(error_of(gemini + "[train]\ngrad_accum = 2\n").find("enable_gradient_accumulation"), std::string::npos);
  EXPECT_NE(error_of(gemini + "[booster]\nmax_norm = 1.0\n").find("plugin.max_norm"), std::string::npos);
}

TEST(TrainConfig, LowLevelZeroKeysMapOntoItsOptions) {
  auto c = parse_train_config(R"(
[plugin]
name = "low_level_zero"
stage = 2
precision = "bf16"
reduce_bucket_size_in_m = 4.0
overlap_allgather = true
cpu_offload = true
extra_dp_size = 1
max_norm = 1.0
)");
  EXPECT_EQ(c.plugin.name, "low_level_zero");
  EXPECT_EQ(c.plugin.low_level_zero.stage, 2);
  EXPECT_EQ(c.plugin.low_level_zero.precision, "bf16");
  EXPECT_EQ(c.plugin.low_level_zero.reduce_bucket_size_in_m, 4.0);
  EXPECT_TRUE(c.plugin.low_level_zero.overlap_allgather);
  EXPECT_TRUE(c.plugin.low_level_zero.cpu_offload);
  EXPECT_EQ(c.plugin.low_level_zero.max_norm, 1.0);
  EXPECT_NE(error_of("[plugin]\nname = \"low_level_zero\"\nstage = 3\n").find("stage=3"), std::string::npos);
  EXPECT_NE(error_of("[plugin]\nname = \"low_level_zero\"\nbucket_cap_mb = 25.0\n").find("bucket_cap_mb"),
            std::string::npos);
  EXPECT_NE(error_of("[plugin]\nname = \"low_level_zero\"\n[booster]\nmax_norm = 1.0\n").find("plugin.max_norm"),
            std::string::npos);
}

// Issue 22: the key lists are the one source of truth. The committed
// reference equals the generated one (regenerate with
// `colossus train --config_reference > docs/config-reference.md`), every key
// in it is one the reader takes, and --print_config's effective config reads
// back to itself with the overrides kept.
TEST(ConfigSchema, CommittedReferenceIsTheGeneratedOne) {
  std::ifstream in(COLOSSUS_CONFIG_REFERENCE);
  ASSERT_TRUE(in) << "missing " << COLOSSUS_CONFIG_REFERENCE;
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_EQ(committed.str(), colossus::apps::config_reference_markdown())
      << "docs/config-reference.md is stale: regenerate it with `colossus train --config_reference > "
         "docs/config-reference.md`";
}

TEST(ConfigSchema, EveryReferencedKeyIsReadAndPrintConfigRoundTrips) {
  const std::string reference = colossus::apps::config_reference_markdown();
  // "## [plugin] with name = "gemini"" headings, then "| `key` |" rows.
  std::istringstream lines(reference);
  std::string line, section, plugin;
  int keys = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("## [", 0) == 0) {
      section = line.substr(4, line.find(']') - 4);
      const auto with = line.find("name = \"");
      plugin = with == std::string::npos ? "" : line.substr(with + 8, line.rfind('"') - with - 8);
      continue;
    }
    if (line.rfind("| `", 0) != 0) continue;
    const std::string key = line.substr(3, line.find('`', 3) - 3);
    // The key's own default, set explicitly, must be accepted (no "unknown key").
    std::string text = plugin.empty() ? "" : "[plugin]\nname = \"" + plugin + "\"\n";
    const auto printed = colossus::apps::effective_config_toml(parse_train_config(text));
    EXPECT_NE(printed.find(key + " = "), std::string::npos) << section << "." << key << " missing from --print_config";
    ++keys;
  }
  EXPECT_GT(keys, 100) << reference;

  const auto config = parse_train_config("[plugin]\nname = \"gemini\"\n[model.config]\nn_layer = 3\n",
                                         {"train.steps=77", "plugin.offload_optim_frac=0.5", "booster.device=cpu"});
  const std::string printed = colossus::apps::effective_config_toml(config);
  const auto again = parse_train_config(printed);
  EXPECT_EQ(colossus::apps::effective_config_toml(again), printed);
  EXPECT_EQ(again.train.steps, 77);
  EXPECT_EQ(again.plugin.gemini.gemini.offload_optim_frac, 0.5);
  EXPECT_EQ(again.model.config.at("n_layer"), "3");
  ASSERT_TRUE(again.booster.device.has_value());
  EXPECT_NE(printed.find("[plugin]"), std::string::npos) << printed;
  EXPECT_EQ(printed.find("bucket_cap_mb"), std::string::npos) << "only the chosen plugin's keys: " << printed;
}
