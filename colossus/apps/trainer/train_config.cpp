#include "colossus/apps/trainer/train_config.h"

#include "colossus/core/errors.h"
#include "colossus/models/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <fstream>
#include <set>
#include <sstream>

namespace colossus::apps {

namespace {

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

// Reads the keys of one TOML table into typed fields, remembering which keys
// it was asked for, so finish() can reject the rest (a typo never passes
// silently).
class SectionReader {
 public:
  SectionReader(const toml::table* table, std::string path) : table_(table), path_(std::move(path)) {}

  void get(const char* key, std::string& out) {
    if (auto* node = find(key)) {
      if (!node->is_string()) fail(key, *node, "a string");
      out = node->value<std::string>().value();
    }
  }
  void get(const char* key, bool& out) {
    if (auto* node = find(key)) {
      if (!node->is_boolean()) fail(key, *node, "true or false");
      out = node->value<bool>().value();
    }
  }
  void get(const char* key, double& out) {
    if (auto* node = find(key)) {
      if (node->is_string()) {
        // TOML has inf/nan literals, but "inf" as a string is what people write.
        auto text = node->value<std::string>().value();
        if (text == "inf" || text == "infinity") {
          out = std::numeric_limits<double>::infinity();
          return;
        }
      }
      if (!node->is_number()) fail(key, *node, "a number");
      out = node->value<double>().value();
    }
  }
  void get(const char* key, int64_t& out) {
    if (auto* node = find(key)) {
      if (!node->is_integer()) fail(key, *node, "an integer");
      out = node->value<int64_t>().value();
    }
  }
  void get(const char* key, int& out) {
    int64_t wide = out;
    get(key, wide);
    out = static_cast<int>(wide);
  }
  void get(const char* key, uint64_t& out) {
    int64_t wide = static_cast<int64_t>(out);
    get(key, wide);
    if (wide < 0) throw ConfigError(fmt::format("{}.{} = {} must not be negative", path_, key, wide));
    out = static_cast<uint64_t>(wide);
  }
  // A sub-table (absent: an empty one).
  const toml::table* table(const char* key) {
    if (auto* node = find(key)) {
      if (!node->is_table()) fail(key, *node, "a table [" + path_ + "." + key + "]");
      return node->as_table();
    }
    return nullptr;
  }
  // Every key of the section as raw nodes (for pass-through sections).
  const toml::table* raw() const { return table_; }

  void finish() const {
    if (!table_) return;
    for (auto&& [key, node] : *table_) {
      if (!asked_.count(std::string(key.str()))) {
        throw ConfigError(fmt::format("unknown key '{}.{}' in the training config; valid keys of [{}]: {}", path_,
                                      key.str(), path_, fmt::join(asked_, ", ")));
      }
    }
  }

 private:
  const toml::node* find(const char* key) {
    asked_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }
  [[noreturn]] void fail(const char* key, const toml::node& node, const std::string& expected) const {
    throw ConfigError(fmt::format("{}.{} is {} in the training config; it must be {}", path_, key, type_name(node),
                                  expected));
  }

  const toml::table* table_;
  std::string path_;
  std::set<std::string> asked_;
};

// JSON text of a TOML value, for the model's config.json keys.
std::string to_json_text(const toml::node& node) {
  std::ostringstream out;
  if (node.is_table()) {
    out << toml::json_formatter{*node.as_table()};
  } else if (node.is_array()) {
    out << toml::json_formatter{*node.as_array()};
  } else if (node.is_string()) {
    return nlohmann::json(*node.value<std::string>()).dump();
  } else if (node.is_boolean()) {
    return *node.value<bool>() ? "true" : "false";
  } else if (node.is_integer()) {
    return std::to_string(*node.value<int64_t>());
  } else if (node.is_floating_point()) {
    return nlohmann::json(*node.value<double>()).dump();
  } else {
    throw ConfigError("model.config values must be strings, numbers, booleans, arrays or tables");
  }
  return out.str();
}

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

void read_loss_scaler(SectionReader& section, amp::LossScalerOptions& o) {
  section.get("initial_scale", o.initial_scale);
  section.get("growth_factor", o.growth_factor);
  section.get("backoff_factor", o.backoff_factor);
  section.get("growth_interval", o.growth_interval);
  section.get("hysteresis", o.hysteresis);
  section.get("min_scale", o.min_scale);
  section.get("max_scale", o.max_scale);
  section.finish();
}

TrainConfig from_table(const toml::table& root) {
  TrainConfig config;
  SectionReader top(&root, "");
  {
    SectionReader s(top.table("model"), "model");
    auto& m = config.model;
    s.get("preset", m.preset);
    s.get("pretrained", m.pretrained);
    s.get("init_seed", m.init_seed);
    if (const auto* overrides = s.table("config")) {
      for (auto&& [key, node] : *overrides) m.config[std::string(key.str())] = to_json_text(node);
    }
    s.finish();
  }
  {
    SectionReader s(top.table("data"), "data");
    auto& d = config.data;
    s.get("source", d.source);
    s.get("tokenizer", d.tokenizer);
    s.get("builtin_bytes", d.builtin_bytes);
    s.get("seq_len", d.seq_len);
    s.get("batch_size", d.batch_size);
    s.get("eval_fraction", d.eval_fraction);
    s.get("prefetch", d.prefetch);
    s.get("shuffle", d.shuffle);
    s.get("cache_dir", d.cache_dir);
    s.finish();
  }
  {
    SectionReader s(top.table("optimizer"), "optimizer");
    auto& o = config.optimizer;
    s.get("name", o.name);
    s.get("lr", o.lr);
    s.get("weight_decay", o.weight_decay);
    s.get("beta1", o.beta1);
    s.get("beta2", o.beta2);
    s.get("eps", o.eps);
    s.get("momentum", o.momentum);
    s.get("nesterov", o.nesterov);
    s.get("decay_1d_params", o.decay_1d_params);
    s.finish();
  }
  {
    SectionReader s(top.table("lr_scheduler"), "lr_scheduler");
    auto& l = config.lr_scheduler;
    s.get("name", l.name);
    s.get("warmup_steps", l.warmup_steps);
    s.get("total_steps", l.total_steps);
    s.get("min_lr_ratio", l.min_lr_ratio);
    s.finish();
  }
  {
    SectionReader s(top.table("plugin"), "plugin");
    auto& p = config.plugin;
    s.get("name", p.name);
    if (p.name == "low_level_zero") {
      // Keys match LowLevelZeroPluginOptions one to one.
      auto& z = p.low_level_zero;
      s.get("stage", z.stage);
      s.get("precision", z.precision);
      s.get("initial_scale", z.initial_scale);
      s.get("min_scale", z.min_scale);
      s.get("growth_factor", z.growth_factor);
      s.get("backoff_factor", z.backoff_factor);
      s.get("growth_interval", z.growth_interval);
      s.get("hysteresis", z.hysteresis);
      s.get("max_scale", z.max_scale);
      s.get("max_norm", z.max_norm);
      s.get("norm_type", z.norm_type);
      s.get("reduce_bucket_size_in_m", z.reduce_bucket_size_in_m);
      s.get("communication_dtype", z.communication_dtype);
      s.get("overlap_communication", z.overlap_communication);
      s.get("overlap_allgather", z.overlap_allgather);
      s.get("cpu_offload", z.cpu_offload);
      s.get("master_weights", z.master_weights);
      s.get("extra_dp_size", z.extra_dp_size);
    } else if (p.name == "gemini") {
      // Keys match GeminiPluginOptions one to one (Colossal-AI's GeminiPlugin names).
      auto& g = p.gemini;
      s.get("placement_policy", g.placement_policy);
      s.get("shard_param_frac", g.shard_param_frac);
      s.get("offload_optim_frac", g.offload_optim_frac);
      s.get("offload_param_frac", g.offload_param_frac);
      s.get("warmup_non_model_data_ratio", g.warmup_non_model_data_ratio);
      s.get("steady_cuda_cap_ratio", g.steady_cuda_cap_ratio);
      s.get("gpu_margin_mem_ratio", g.gpu_margin_mem_ratio);
      s.get("precision", g.precision);
      s.get("master_weights", g.master_weights);
      s.get("pin_memory", g.pin_memory);
      s.get("max_prefetch", g.max_prefetch);
      s.get("enable_gradient_accumulation", g.enable_gradient_accumulation);
      s.get("search_range_m", g.search_range_m);
      s.get("min_chunk_size_m", g.min_chunk_size_m);
      s.get("hidden_dim", g.hidden_dim);
      s.get("initial_scale", g.initial_scale);
      s.get("min_scale", g.min_scale);
      s.get("growth_factor", g.growth_factor);
      s.get("backoff_factor", g.backoff_factor);
      s.get("growth_interval", g.growth_interval);
      s.get("hysteresis", g.hysteresis);
      s.get("max_scale", g.max_scale);
      s.get("max_norm", g.max_norm);
      s.get("norm_type", g.norm_type);
      s.get("nvme_offload_fraction", g.nvme_offload_fraction);
      s.get("nvme_offload_dir", g.nvme_offload_dir);
      s.get("lazy_init", p.lazy_init);
    } else if (p.name == "hybrid_parallel") {
      // Keys match HybridParallelPluginOptions one to one (loss scaler keys flat, as low_level_zero's).
      auto& h = p.hybrid_parallel;
      s.get("tp_size", h.tp_size);
      s.get("pp_size", h.pp_size);
      s.get("pp_style", h.pp_style);
      s.get("num_model_chunks", h.num_model_chunks);
      s.get("num_microbatches", h.num_microbatches);
      s.get("microbatch_size", h.microbatch_size);
      s.get("overlap_p2p", h.overlap_p2p);
      s.get("gradient_checkpointing_ratio", h.gradient_checkpointing_ratio);
      s.get("sp_size", h.sp_size);
      s.get("enable_sequence_parallelism", h.enable_sequence_parallelism);
      s.get("sequence_parallelism_mode", h.sequence_parallelism_mode);
      s.get("inner_ring_size", h.inner_ring_size);
      s.get("zero_stage", h.zero_stage);
      s.get("precision", h.precision);
      s.get("max_norm", h.max_norm);
      s.get("norm_type", h.norm_type);
      s.get("initial_scale", h.loss_scaler.initial_scale);
      s.get("min_scale", h.loss_scaler.min_scale);
      s.get("growth_factor", h.loss_scaler.growth_factor);
      s.get("backoff_factor", h.loss_scaler.backoff_factor);
      s.get("growth_interval", h.loss_scaler.growth_interval);
      s.get("hysteresis", h.loss_scaler.hysteresis);
      s.get("max_scale", h.loss_scaler.max_scale);
      s.get("parallel_output", h.parallel_output);
      s.get("make_vocab_size_divisible_by", h.make_vocab_size_divisible_by);
      s.get("dp_outside", h.dp_outside);
      s.get("bucket_cap_mb", h.bucket_cap_mb);
    } else {
      // Keys match DDPPluginOptions one to one.
      s.get("broadcast_buffers", p.ddp.broadcast_buffers);
      s.get("bucket_cap_mb", p.ddp.bucket_cap_mb);
      s.get("find_unused_parameters", p.ddp.find_unused_parameters);
      s.get("check_reduction", p.ddp.check_reduction);
      s.get("gradient_as_bucket_view", p.ddp.gradient_as_bucket_view);
      s.get("static_graph", p.ddp.static_graph);
    }
    s.finish();
  }
  {
    SectionReader s(top.table("booster"), "booster");
    auto& b = config.booster;
    s.get("mixed_precision", b.mixed_precision);
    s.get("max_norm", b.max_norm);
    s.get("norm_type", b.norm_type);
    std::string device;
    s.get("device", device);
    if (!device.empty()) {
      try {
        b.device = c10::Device(device);
      } catch (const std::exception&) {
        throw ConfigError(fmt::format("booster.device = '{}' is not a device; use e.g. 'cpu', 'cuda' or 'cuda:1'",
                                      device));
      }
    }
    SectionReader scaler(s.table("loss_scaler"), "booster.loss_scaler");
    read_loss_scaler(scaler, b.loss_scaler);
    s.finish();
  }
  {
    SectionReader s(top.table("train"), "train");
    auto& t = config.train;
    s.get("steps", t.steps);
    s.get("grad_accum", t.grad_accum);
    s.get("seed", t.seed);
    s.get("output_dir", t.output_dir);
    s.get("log_every", t.log_every);
    s.get("eval_every", t.eval_every);
    s.get("eval_batches", t.eval_batches);
    s.get("save_every", t.save_every);
    s.get("keep_last", t.keep_last);
    s.get("max_nonfinite_steps", t.max_nonfinite_steps);
    s.get("async_save", t.async_save);
    s.get("cuda_graph", t.cuda_graph);
    s.get("size_per_shard_mb", t.size_per_shard_mb);
    s.get("tensorboard", t.tensorboard);
    s.get("backend", t.backend);
    s.get("peak_tflops", t.peak_tflops);
    s.get("sample_prompt", t.sample_prompt);
    s.get("sample_tokens", t.sample_tokens);
    s.get("sample_temperature", t.sample_temperature);
    s.finish();
  }
  top.finish();
  // Under pp a step's grad_accum loader batches run as one pipeline batch
  // (booster.execute_pipeline); by default each loader batch is a microbatch.
  auto& h = config.plugin.hybrid_parallel;
  if (config.plugin.name == "hybrid_parallel" && h.pp_size > 1 && h.num_microbatches == 0 && h.microbatch_size == 0)
    h.microbatch_size = config.data.batch_size;
  return config;
}

void require_positive(const char* key, int64_t value, const char* example) {
  if (value < 1) throw ConfigError(fmt::format("{} = {} must be at least 1 (e.g. {})", key, value, example));
}

void require_non_negative(const char* key, int64_t value) {
  if (value < 0) throw ConfigError(fmt::format("{} = {} must not be negative (0 turns it off)", key, value));
}

}  // namespace

void TrainConfig::validate() const {
  if (model.pretrained.empty()) models::preset(model.preset);  // throws listing the presets
  require_positive("data.seq_len", data.seq_len, "128");
  require_positive("data.batch_size", data.batch_size, "8");
  require_positive("data.prefetch", data.prefetch, "4");
  if (data.source == "builtin") require_positive("data.builtin_bytes", data.builtin_bytes, "4194304");
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
  if (plugin.name != "ddp" && plugin.name != "low_level_zero" && plugin.name != "gemini" &&
      plugin.name != "hybrid_parallel") {
    throw ConfigError(fmt::format(
        "plugin.name = '{}' is unknown; available: ddp, low_level_zero, gemini, hybrid_parallel", plugin.name));
  }
  if (plugin.name == "gemini") {
    plugin.gemini.validate();
    if (booster.mixed_precision != "fp32" || booster.max_norm > 0.0) {
      throw ConfigError(fmt::format("booster.mixed_precision = '{}' / booster.max_norm = {} are not used with plugin "
                                    "gemini; set plugin.precision and plugin.max_norm instead",
                                    booster.mixed_precision, booster.max_norm));
    }
    if (train.grad_accum > 1 && !plugin.gemini.enable_gradient_accumulation) {
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
