#include "colossus/apps/trainer/train_config.h"

#include "colossus/apps/trainer/config_schema.h"

#include "colossus/core/errors.h"
#include "colossus/data/jsonl_records.h"
#include "colossus/data/sft_examples.h"
#include "colossus/data/tokenizer.h"
#include "colossus/lora/lora_config.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/config.h"
#include "colossus/models/fp8_linear.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace colossus::apps {

namespace {

// "a.b.c=value": sets table[a][b][c] to the TOML value (bare words are strings).
void apply_override(toml::table& root, const std::string& override_text) {
  auto eq = override_text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(fmt::format("override '{}' is not of the form section.key=value (e.g. --train.steps=100)",
                                  override_text));
  }
  std::string path = override_text.substr(0, eq);
  std::string value_text = override_text.substr(eq + 1);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    auto dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& part : parts) {
    if (part.empty()) throw ConfigError(fmt::format("override '{}' has an empty key part", override_text));
  }
  // The value in TOML syntax; a bare word that does not parse is a string.
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value_text);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value_text}};
  }
  toml::table* table = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto* next = table->get(parts[i]);
    if (!next) {
      table->insert(parts[i], toml::table{});
      next = table->get(parts[i]);
    }
    if (!next->is_table()) {
      throw ConfigError(fmt::format("override '{}': '{}' is not a section", override_text, parts[i]));
    }
    table = next->as_table();
  }
  table->insert_or_assign(parts.back(), *parsed.get("v"));
}

TrainConfig from_table(const toml::table& root) {
  TrainConfig config = read_config_tables(root);
  // Under pp a step's grad_accum loader batches run as one pipeline batch
  // (booster.execute_pipeline); by default each loader batch is a microbatch
  // (for dpo its chosen and rejected rows: two a pair).
  auto& h = config.plugin.hybrid_parallel;
  if (config.plugin.name == "hybrid_parallel" && h.pp_size > 1 && h.num_microbatches == 0 && h.microbatch_size == 0)
    h.microbatch_size = config.data.batch_size * (config.train.task == "dpo" ? 2 : 1);
  auto& moe = config.plugin.moe_hybrid_parallel;
  if (config.plugin.name == "moe_hybrid_parallel" && moe.pp_size > 1 && moe.num_microbatches == 0 &&
      moe.microbatch_size == 0)
    moe.microbatch_size = config.data.batch_size;
  return config;
}

void require_positive(const char* key, int64_t value, const char* example) {
  if (value < 1) throw ConfigError(fmt::format("{} = {} must be at least 1 (e.g. {})", key, value, example));
}

void require_non_negative(const char* key, int64_t value) {
  if (value < 0) throw ConfigError(fmt::format("{} = {} must not be negative (0 turns it off)", key, value));
}

}  // namespace

namespace {

// train.task = "sft" or "dpo": the data keys they read and the layouts they run under.
void validate_records_task(const TrainConfig& c) {
  const std::string task = fmt::format("train.task = \"{}\"", c.train.task);
  data::parse_record_format(c.data.format);  // throws listing the names
  data::parse_train_on(c.data.train_on);
  data::parse_truncation(c.data.truncation);
  if (c.data.max_length < 0 || c.data.max_length > c.data.seq_len) {
    throw ConfigError(fmt::format("data.max_length = {} must be in [0, data.seq_len = {}] (0: seq_len) for {}",
                                  c.data.max_length, c.data.seq_len, c.train.task));
  }
  if (c.data.tokenize_threads < 1 || c.data.tokenize_threads > 256) {
    throw ConfigError(fmt::format("data.tokenize_threads = {} must be in [1, 256]", c.data.tokenize_threads));
  }
  if (c.data.source == "builtin") {
    throw ConfigError(task + " reads JSONL records; set data.source to a .jsonl file, a folder or a glob");
  }
  const auto& hybrid = c.plugin.hybrid_parallel;
  if (c.plugin.name == "hybrid_parallel" && hybrid.pp_size > 1 && c.train.task == "dpo") {
    // A microbatch must hold whole pairs (rows chosen, rejected, chosen, ...).
    const int64_t rows = 2 * c.data.batch_size * c.train.grad_accum;
    const int64_t mb_rows = hybrid.microbatch_size > 0  ? hybrid.microbatch_size
                            : hybrid.num_microbatches > 0 ? rows / std::max<int64_t>(hybrid.num_microbatches, 1)
                                                          : 2 * c.data.batch_size;
    if (mb_rows % 2 != 0) {
      throw ConfigError(fmt::format(
          "dpo under pipeline parallelism: a microbatch of {} rows would split a chosen/rejected pair (a step has {} "
          "rows, two a pair); set plugin.microbatch_size to an even number of rows (default: 2 x data.batch_size)",
          mb_rows, rows));
    }
  }
  // Padded / packed rows need per-document attention: split_gather and ring
  // (over the tp group) gather the sequence for it, all_to_all (Ulysses)
  // attends over the whole sequence under the document mask, ring_attn masks
  // each block by the document ids. DPO sums each sequence's log-probs over
  // the sp group where the logits stay sharded (all_to_all, ring_attn).
  if (c.plugin.name == "hybrid_parallel" && hybrid.pp_size > 1 &&
      (hybrid.enable_sequence_parallelism || hybrid.sp_size > 1)) {
    throw ConfigError(fmt::format("{} with pipeline and sequence parallelism together is not supported yet (padded and "
                                  "packed rows do not shard along the sequence inside the pipeline); drop one",
                                  task));
  }
  if (c.train.cuda_graph) {
    throw ConfigError("train.cuda_graph needs fixed-shape batches; " + c.train.task +
                      " batches vary in length: set train.cuda_graph = false");
  }
  if (c.train.task != "dpo") return;
  c.dpo.validate();
  if (c.data.format != "auto" && c.data.format != "preference")
    throw ConfigError(fmt::format("data.format = \"{}\" with train.task = \"dpo\": DPO trains on preference records "
                                  "(prompt, chosen, rejected); use \"preference\" or \"auto\"",
                                  c.data.format));
  if (c.data.packing && c.plugin.name == "hybrid_parallel" && c.plugin.hybrid_parallel.pp_size > 1)
    throw ConfigError("data.packing = true with train.task = \"dpo\" under pipeline parallelism is not supported yet "
                      "(a microbatch must hold whole pairs); set data.packing = false");
  // The per-sequence log-probs are taken from whole logits: tensor
  // parallelism gathers them (parallel_output = false); split_gather / ring
  // gather the sequence back before the head.
  const auto& hp = c.plugin.hybrid_parallel;
  if (c.plugin.name == "hybrid_parallel" && hp.parallel_output)
    throw ConfigError("train.task = \"dpo\" with hybrid_parallel needs plugin.parallel_output = false (the "
                      "sequence log-probs come from gathered logits)");
}

// plugin.name = "moe_hybrid_parallel": its options, and what the run around
// it must leave off. The sizes against the world (ep_size divides the dp size)
// are checked when the plugin lays out the ranks, and the model's kind
// (an MoE model) when the model config is known: both before any allocation.
void validate_moe_plugin(const TrainConfig& c) {
  c.plugin.moe_hybrid_parallel.validate();
  // As the other plugins that own precision and clipping.
  if (c.booster.mixed_precision != "fp32" || c.booster.max_norm > 0.0) {
    throw ConfigError(fmt::format("booster.mixed_precision = '{}' / booster.max_norm = {} are not used with plugin "
                                  "moe_hybrid_parallel; set plugin.precision and plugin.max_norm instead",
                                  c.booster.mixed_precision, c.booster.max_norm));
  }
  // The router losses would count padding as routed tokens (the plugin
  // refuses padded and packed rows), so MoE trains on token streams.
  if (c.train.task != "pretrain") {
    throw ConfigError(fmt::format("train.task = \"{}\" with plugin moe_hybrid_parallel is not supported yet (its "
                                  "padded or packed rows would be routed as tokens); use train.task = \"pretrain\", "
                                  "or plugin.name = \"ddp\" / \"low_level_zero\" for MoE fine-tuning",
                                  c.train.task));
  }
  if (c.lora.enabled()) {
    throw ConfigError("[lora] with plugin moe_hybrid_parallel is not supported (experts are sharded over ep before "
                      "adapters could wrap them); set lora.r = 0, or use plugin.name = \"ddp\" for LoRA on an MoE "
                      "model");
  }
}

}  // namespace

const std::vector<std::string>& plugin_names() {
  static const std::vector<std::string> names{"ddp", "low_level_zero", "gemini", "hybrid_parallel",
                                              "moe_hybrid_parallel"};
  return names;
}

namespace {

// "q_proj, v_proj" -> {"q_proj", "v_proj"}; "" -> {}.
std::vector<std::string> comma_list(const std::string& names) {
  std::vector<std::string> list;
  for (size_t begin = 0; begin <= names.size();) {
    size_t end = names.find(',', begin);
    if (end == std::string::npos) end = names.size();
    std::string name = names.substr(begin, end - begin);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!name.empty()) list.push_back(name);
    begin = end + 1;
  }
  return list;
}

}  // namespace

lora::LoraConfig lora_config(const LoraSection& section) {
  return lora::LoraConfig{.r = section.r,
                          .lora_alpha = section.lora_alpha,
                          .lora_dropout = section.lora_dropout,
                          .target_modules = comma_list(section.target_modules),
                          .modules_to_save = comma_list(section.modules_to_save),
                          .bias = section.bias,
                          .use_rslora = section.use_rslora};
}

void TrainConfig::validate() const {
  if (model.pretrained.empty()) models::preset(model.preset);  // throws listing the presets
  if (!(model.gradient_checkpointing_ratio >= 0.0 && model.gradient_checkpointing_ratio <= 1.0)) {
    throw ConfigError(fmt::format("model.gradient_checkpointing_ratio = {} must be in [0, 1]; 1.0 reruns every "
                                  "block's forward in backward, 0 is off",
                                  model.gradient_checkpointing_ratio));
  }
  models::parse_checkpoint_granularity(model.gradient_checkpointing_granularity);  // throws naming the value
  if (model.gradient_checkpointing_ratio > 0.0 && plugin.name == "hybrid_parallel") {
    // That plugin checkpoints the blocks after sharding them over tp / pp.
    throw ConfigError(fmt::format("model.gradient_checkpointing_ratio = {} with plugin hybrid_parallel: set "
                                  "plugin.gradient_checkpointing_ratio instead (it wraps the blocks after tp / pp "
                                  "sharding)",
                                  model.gradient_checkpointing_ratio));
  }
  if (model.gradient_checkpointing_ratio > 0.0 && plugin.name == "moe_hybrid_parallel") {
    // The plugin swaps each sparse block's experts for this rank's while
    // boosting, so it wraps the blocks itself, afterwards.
    throw ConfigError(fmt::format("model.gradient_checkpointing_ratio = {} with plugin moe_hybrid_parallel: set "
                                  "plugin.gradient_checkpointing_ratio instead (it wraps the blocks after the expert "
                                  "and tp sharding)",
                                  model.gradient_checkpointing_ratio));
  }
  if (model.use_fp8) {
    if (model.fp8_scaling != "tensorwise" && model.fp8_scaling != "rowwise") {
      throw ConfigError(fmt::format("model.fp8_scaling is \"{}\"; valid: \"tensorwise\", \"rowwise\"", model.fp8_scaling));
    }
    models::Fp8Recipe{.rowwise = model.fp8_scaling == "rowwise",
                      .grad_format = model.fp8_grad_format,
                      .amax_history_len = model.fp8_amax_history_len}
        .validate();
    const double checkpointing = plugin.name == "hybrid_parallel" ? plugin.hybrid_parallel.gradient_checkpointing_ratio
                                                                 : model.gradient_checkpointing_ratio;
    if (model.fp8_amax_history_len > 0 && checkpointing > 0.0) {
      throw ConfigError(fmt::format(
          "model.fp8_amax_history_len = {} (delayed scaling) with activation checkpointing ({}gradient_checkpointing_ratio "
          "= {}): the rerun would quantise at scales the forward's maxima have moved; set one of them to 0",
          model.fp8_amax_history_len, plugin.name == "hybrid_parallel" ? "plugin." : "model.", checkpointing));
    }
    if (plugin.name == "moe_hybrid_parallel") {
      // Its experts run from packed buffers, not Linear leaves.
      throw ConfigError("model.use_fp8 with plugin moe_hybrid_parallel is not supported yet; train in FP8 under ddp, "
                        "low_level_zero, gemini or hybrid_parallel");
    }
    if (plugin.name == "hybrid_parallel" && plugin.hybrid_parallel.enable_sequence_parallelism &&
        plugin.hybrid_parallel.sequence_parallelism_mode == "ring") {
      throw ConfigError("model.use_fp8 with sequence_parallelism_mode \"ring\" is not supported (the ring fuses its "
                        "matmuls with its communication); use \"split_gather\", \"ring_attn\" or \"all_to_all\"");
    }
  }
  require_positive("data.seq_len", data.seq_len, "128");
  require_positive("data.batch_size", data.batch_size, "8");
  require_positive("data.prefetch", data.prefetch, "4");
  if (data.source == "builtin") require_positive("data.builtin_bytes", data.builtin_bytes, "4194304");
  if (train.task != "pretrain" && train.task != "sft" && train.task != "dpo") {
    throw ConfigError(fmt::format("train.task is \"{}\"; valid: pretrain, sft, dpo", train.task));
  }
  if (train.task != "pretrain") validate_records_task(*this);
  if (lora.r < 0) throw ConfigError(fmt::format("lora.r = {} must be >= 0 (0: no LoRA; PEFT's default is 8)", lora.r));
  if (!lora.adapter.empty() && (!lora.modules_to_save.empty() || lora.bias != "none"))
    throw ConfigError(fmt::format("lora.adapter = '{}' brings its own adapter_config.json (modules_to_save, bias); "
                                  "leave lora.modules_to_save and lora.bias unset",
                                  lora.adapter));
  if (!lora.adapter.empty() && lora.r != 0)
    throw ConfigError(fmt::format("lora.adapter = '{}' brings its own adapter_config.json; leave lora.r at 0 (it is {})",
                                  lora.adapter, lora.r));
  if (lora.quantize != "" && lora.quantize != "nf4")
    throw ConfigError(fmt::format("lora.quantize = \"{}\"; valid: \"nf4\" (QLoRA) or \"\" (none)", lora.quantize));
  if (!lora.quantize.empty() && !lora.enabled())
    throw ConfigError("lora.quantize = \"nf4\" quantises the frozen base of a LoRA run: set lora.r (or lora.adapter)");
  if (lora.enabled()) {
    if (lora.adapter.empty()) lora_config(lora).validate();
    // DPO's LoRA reference runs the policy's own layers with their snapshot:
    // a second pipeline pass that execute_pipeline does not make.
    if (plugin.name == "hybrid_parallel" && plugin.hybrid_parallel.pp_size > 1 && train.task == "dpo")
      throw ConfigError(fmt::format("[lora] with train.task = \"dpo\" under pipeline parallelism (plugin.pp_size = "
                                    "{}) is not supported yet: use tensor parallelism (tp_size) with ZeRO or data "
                                    "parallelism",
                                    plugin.hybrid_parallel.pp_size));
    if (plugin.name == "hybrid_parallel" && !lora.quantize.empty() && plugin.hybrid_parallel.tp_size > 1)
      throw ConfigError("lora.quantize = \"nf4\" does not run under tensor parallelism (plugin.tp_size > 1) yet");
    if (plugin.lazy_init)
      throw ConfigError("[lora] loads the base model whole before adding adapters: set plugin.lazy_init = false");
    if (train.cuda_graph) throw ConfigError("train.cuda_graph is not supported with [lora] yet: set it to false");
  }
  if (!(data.eval_fraction >= 0.0 && data.eval_fraction < 1.0)) {
    throw ConfigError(fmt::format("data.eval_fraction = {} must be in [0, 1) (e.g. 0.02)", data.eval_fraction));
  }
  static const std::set<std::string> optimizers{"adamw", "adam", "sgd", "lamb", "hybrid_adam"};
  if (!optimizers.count(optimizer.name)) {
    throw ConfigError(fmt::format("optimizer.name = '{}' is unknown; use one of {}", optimizer.name,
                                  fmt::join(optimizers, ", ")));
  }
  if (!(optimizer.lr >= 0.0)) throw ConfigError(fmt::format("optimizer.lr = {} must be >= 0", optimizer.lr));
  static const std::set<std::string> schedulers{"constant", "linear", "cosine"};
  if (!schedulers.count(lr_scheduler.name)) {
    throw ConfigError(fmt::format("lr_scheduler.name = '{}' is unknown; use one of {}", lr_scheduler.name,
                                  fmt::join(schedulers, ", ")));
  }
  require_non_negative("lr_scheduler.warmup_steps", lr_scheduler.warmup_steps);
  require_non_negative("lr_scheduler.total_steps", lr_scheduler.total_steps);
  if (std::find(plugin_names().begin(), plugin_names().end(), plugin.name) == plugin_names().end()) {
    throw ConfigError(fmt::format("plugin.name = '{}' is unknown; available: {}", plugin.name,
                                  fmt::join(plugin_names(), ", ")));
  }
  if (plugin.name == "moe_hybrid_parallel") validate_moe_plugin(*this);
  if (plugin.name == "gemini") {
    plugin.gemini.validate();
    if (booster.mixed_precision != "fp32" || booster.max_norm > 0.0) {
      throw ConfigError(fmt::format("booster.mixed_precision = '{}' / booster.max_norm = {} are not used with plugin "
                                    "gemini; set plugin.precision and plugin.max_norm instead",
                                    booster.mixed_precision, booster.max_norm));
    }
    if (train.grad_accum > 1 && !plugin.gemini.gemini.enable_gradient_accumulation) {
      throw ConfigError(fmt::format("train.grad_accum = {} with plugin gemini needs plugin.enable_gradient_accumulation "
                                    "= true",
                                    train.grad_accum));
    }
  }
  if (plugin.name == "ddp") plugin.ddp.validate();
  if (plugin.name == "hybrid_parallel") {
    plugin.hybrid_parallel.validate();
    // As low_level_zero: the plugin owns precision and clipping (norms over tp).
    if (booster.mixed_precision != "fp32" || booster.max_norm > 0.0) {
      throw ConfigError(fmt::format("booster.mixed_precision = '{}' / booster.max_norm = {} are not used with plugin "
                                    "hybrid_parallel; set plugin.precision and plugin.max_norm instead",
                                    booster.mixed_precision, booster.max_norm));
    }
  }
  if (plugin.name == "low_level_zero") {
    plugin.low_level_zero.validate();
    // The plugin owns precision and clipping; the booster's would be ignored.
    if (booster.mixed_precision != "fp32" || booster.max_norm > 0.0) {
      throw ConfigError(fmt::format("booster.mixed_precision = '{}' / booster.max_norm = {} are not used with plugin "
                                    "low_level_zero; set plugin.precision and plugin.max_norm instead",
                                    booster.mixed_precision, booster.max_norm));
    }
  }
  booster.validate();
  require_positive("train.steps", train.steps, "1000");
  require_positive("train.grad_accum", train.grad_accum, "1");
  require_positive("train.log_every", train.log_every, "10");
  require_non_negative("train.eval_every", train.eval_every);
  require_non_negative("train.eval_batches", train.eval_batches);
  require_non_negative("train.save_every", train.save_every);
  require_non_negative("train.keep_last", train.keep_last);
  require_positive("train.max_nonfinite_steps", train.max_nonfinite_steps, "3");
  require_positive("train.size_per_shard_mb", train.size_per_shard_mb, "1024");
  require_non_negative("train.sample_tokens", train.sample_tokens);
  if (!(train.sample_temperature >= 0.0)) {
    throw ConfigError(fmt::format("train.sample_temperature = {} must be >= 0 (0 is greedy)", train.sample_temperature));
  }
  if (train.output_dir.empty()) throw ConfigError("train.output_dir is empty; name a directory, e.g. runs/demo");
  static const std::set<std::string> backends{"auto", "nccl", "mpi"};
  if (!backends.count(train.backend)) {
    throw ConfigError(fmt::format("train.backend = '{}' is unknown; use one of {}", train.backend,
                                  fmt::join(backends, ", ")));
  }
}

namespace {

// data.tokenizer unset: the tokenizer the pretrained model came with, never a
// silent byte tokenizer for a model trained on another one.
void resolve_tokenizer(TrainConfig& config) {
  if (!config.data.tokenizer.empty()) return;
  if (config.model.pretrained.empty()) {
    config.data.tokenizer = "byte";
  } else if (data::holds_tokenizer(config.model.pretrained)) {
    config.data.tokenizer = config.model.pretrained;
  } else {
    throw ConfigError(fmt::format(
        "model.pretrained = '{}' has no tokenizer files (tokenizer.json, vocab.json + merges.txt, tokenizer.model); "
        "set data.tokenizer to the tokenizer's directory, or data.tokenizer = \"byte\" to train on byte tokens",
        config.model.pretrained));
  }
}

}  // namespace

TrainConfig parse_train_config(const std::string& toml_text, const std::vector<std::string>& overrides,
                               const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ConfigError(fmt::format("{}:{}:{}: {}", origin, where.line, where.column, e.description()));
  }
  for (const auto& o : overrides) apply_override(root, o);
  TrainConfig config = from_table(root);
  resolve_tokenizer(config);
  std::ostringstream text;
  text << root;
  config.toml_text = text.str() + "\n";
  config.validate();
  return config;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot read the training config '{}': no such file", path));
  std::stringstream text;
  text << in.rdbuf();
  return parse_train_config(text.str(), overrides, path);
}

}  // namespace colossus::apps
