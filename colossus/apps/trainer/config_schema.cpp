#include "colossus/apps/trainer/config_schema.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <vector>

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
  // A number, or the word `unset` for none.
  void get(const char* key, std::optional<double>& out, const char* unset) {
    if (auto* node = find(key)) {
      if (node->is_number()) {
        out = node->value<double>().value();
      } else if (node->is_string() && node->value<std::string>().value() == unset) {
        out.reset();
      } else {
        fail(key, *node, fmt::format("a number or \"{}\"", unset));
      }
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
  void get(const char* key, std::vector<int64_t>& out) {
    if (auto* node = find(key)) {
      const auto* array = node->as_array();
      if (!array) fail(key, *node, "an array of integers, e.g. [1, 3]");
      out.clear();
      for (const auto& item : *array) {
        if (!item.is_integer()) fail(key, item, "an array of integers, e.g. [1, 3]");
        out.push_back(*item.value<int64_t>());
      }
    }
  }
  // A sub-table (absent: an empty one).
  const toml::table* table(const char* key) {
    if (auto* node = find(key)) {
      if (!node->is_table()) fail(key, *node, "a table [" + path_ + "." + key + "]");
      return node->as_table();
    }
    return nullptr;
  }

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

// One key: its name in its section, its type and one line for the
// reference, and how it is read from and written to a TrainConfig.
struct Key {
  std::string name;
  std::string type;  // "string", "integer", "number", "boolean"
  std::string doc;
  std::function<void(SectionReader&, TrainConfig&)> read;
  std::function<void(const TrainConfig&, toml::table&)> write;
};

template <class T>
constexpr const char* type_of() {
  if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, bool>) return "boolean";
  else if constexpr (std::is_floating_point_v<T>) return "number";
  else return "integer";
}

template <class T>
void insert_value(toml::table& table, const std::string& name, const T& value) {
  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, bool> || std::is_floating_point_v<T>) {
    table.insert_or_assign(name, value);
  } else {
    table.insert_or_assign(name, static_cast<int64_t>(value));
  }
}

// `field(config)` is the TrainConfig member the key binds to.
template <class Field>
Key key(const char* name, const char* doc, Field field) {
  using T = std::remove_cvref_t<decltype(field(std::declval<TrainConfig&>()))>;
  return Key{name, type_of<T>(), doc,
             [name, field](SectionReader& s, TrainConfig& c) { s.get(name, field(c)); },
             [name, field](const TrainConfig& c, toml::table& t) {
               insert_value(t, name, field(const_cast<TrainConfig&>(c)));
             }};
}

#define COLOSSUS_KEY(name, doc, member) key(name, doc, [](TrainConfig& c) -> auto& { return c.member; })

// A table of keys; `when` (for the plugin's) names the plugin they belong to.
struct Section {
  std::string path;  // "train", "booster.loss_scaler", "plugin"
  std::string when;  // "" or e.g. "name = \"gemini\""
  std::vector<Key> keys;
};

std::vector<Key> loss_scaler_keys(const char* prefix_doc, const std::function<amp::LossScalerOptions&(TrainConfig&)>& of) {
  auto k = [&](const char* name, const char* doc, auto member) {
    using T = std::remove_cvref_t<decltype(std::declval<amp::LossScalerOptions&>().*member)>;
    return Key{name, type_of<T>(), fmt::format("{}{}", prefix_doc, doc),
               [name, of, member](SectionReader& s, TrainConfig& c) { s.get(name, of(c).*member); },
               [name, of, member](const TrainConfig& c, toml::table& t) {
                 insert_value(t, name, of(const_cast<TrainConfig&>(c)).*member);
               }};
  };
  return {k("initial_scale", "loss scale at the first step", &amp::LossScalerOptions::initial_scale),
          k("min_scale", "the scale never goes below this", &amp::LossScalerOptions::min_scale),
          k("growth_factor", "scale x this after growth_interval finite steps", &amp::LossScalerOptions::growth_factor),
          k("backoff_factor", "scale x this after hysteresis overflowing steps", &amp::LossScalerOptions::backoff_factor),
          k("growth_interval", "finite steps between growths", &amp::LossScalerOptions::growth_interval),
          k("hysteresis", "overflowing steps tolerated before a backoff", &amp::LossScalerOptions::hysteresis),
          k("max_scale", "the scale never grows past this", &amp::LossScalerOptions::max_scale)};
}

// gemini's gpu_margin_mem_ratio: a number, or "measured" (unset, the default).
Key margin_ratio_key() {
  return Key{
      "gpu_margin_mem_ratio", "number or \"measured\"",
      "auto: \"measured\": optimizer shards take all of the device margin the warm-up's traced peak leaves (under "
      "steady_cuda_cap_ratio, after the working set, the parameter shards and the non-model peak plus 10%); a number: "
      "that share of it, as Colossal-AI's key (its default 0.0 keeps every optimizer shard on the host); either way "
      "more of it where the host would otherwise hold over 85% of its memory",
      [](SectionReader& r, TrainConfig& c) {
        r.get("gpu_margin_mem_ratio", c.plugin.gemini.gemini.gpu_margin_mem_ratio, "measured");
      },
      [](const TrainConfig& c, toml::table& t) {
        const auto& ratio = c.plugin.gemini.gemini.gpu_margin_mem_ratio;
        if (ratio) {
          t.insert_or_assign("gpu_margin_mem_ratio", *ratio);
        } else {
          t.insert_or_assign("gpu_margin_mem_ratio", std::string("measured"));
        }
      }};
}

// An array of integers ("num_layers_per_stage = [1, 3]").
Key int_list_key(const char* name, const char* doc, std::function<std::vector<int64_t>&(TrainConfig&)> of) {
  return Key{name, "array of integers", doc,
             [name, of](SectionReader& s, TrainConfig& c) { s.get(name, of(c)); },
             [name, of](const TrainConfig& c, toml::table& t) {
               toml::array array;
               for (int64_t v : of(const_cast<TrainConfig&>(c))) array.push_back(v);
               t.insert_or_assign(name, std::move(array));
             }};
}

void append_keys(std::vector<Key>& keys, std::vector<Key> more) {
  for (auto& key : more) keys.push_back(std::move(key));
}

const std::vector<Section>& sections() {
  static const std::vector<Section> all = [] {
    std::vector<Section> s;
    s.push_back({"model", "", {
        COLOSSUS_KEY("preset", "built-in architecture: gpt2-124m, gpt2-350m, gpt2-tiny, llama-1b-like, llama-tiny, mixtral-tiny", model.preset),
        COLOSSUS_KEY("pretrained", "a Hugging Face model directory to fine-tune; replaces the preset", model.pretrained),
        COLOSSUS_KEY("init_seed", "seed of the Hugging Face-style initialisation (ignored with pretrained)", model.init_seed),
        COLOSSUS_KEY("gradient_checkpointing_ratio", "activation checkpointing under any plugin: share of blocks that rerun their forward in backward (hybrid_parallel: plugin.gradient_checkpointing_ratio)", model.gradient_checkpointing_ratio),
        COLOSSUS_KEY("gradient_checkpointing_granularity", "what a checkpointed block reruns: \"full\" (the whole block, only its input kept) or \"mlp\" (selective: only its MLP, attention's activations kept; dense blocks)", model.gradient_checkpointing_granularity),
        COLOSSUS_KEY("use_fp8", "FP8 matmuls (e4m3 forward, at::_scaled_mm) in the decoder blocks' linear layers; ddp, low_level_zero, gemini and hybrid_parallel (not with sp mode ring)", model.use_fp8),
        COLOSSUS_KEY("fp8_scaling", "\"tensorwise\" or \"rowwise\": one FP8 scale per tensor, or per row of x and W, in the forward", model.fp8_scaling),
        COLOSSUS_KEY("fp8_grad_format", "\"e5m2\" (range) or \"e4m3\" (precision): the output gradient's FP8 format", model.fp8_grad_format),
        COLOSSUS_KEY("fp8_keep_first_last", "keep the first and last blocks in the model's dtype (with use_fp8)", model.fp8_keep_first_last),
        COLOSSUS_KEY("fp8_amax_history_len", "> 0: delayed scaling, each operand's scale from the largest of its last N maxima (tensorwise only; not in checkpoints); 0: its current maximum", model.fp8_amax_history_len)}});
    s.push_back({"data", "", {
        COLOSSUS_KEY("source", "\"builtin\" (generated corpus), a UTF-8 text file, a directory of *.txt, or a directory of token shards", data.source),
        COLOSSUS_KEY("tokenizer", "\"byte\", a Hugging Face tokenizer directory or file; empty: model.pretrained's own (byte without one)", data.tokenizer),
        COLOSSUS_KEY("builtin_bytes", "size of the built-in corpus in bytes", data.builtin_bytes),
        COLOSSUS_KEY("seq_len", "tokens per sequence", data.seq_len),
        COLOSSUS_KEY("batch_size", "sequences per rank per micro-batch", data.batch_size),
        COLOSSUS_KEY("eval_fraction", "share of the documents held out for the eval loss", data.eval_fraction),
        COLOSSUS_KEY("prefetch", "batches the loader prepares ahead", data.prefetch),
        COLOSSUS_KEY("shuffle", "shuffle the training samples each epoch", data.shuffle),
        COLOSSUS_KEY("cache_dir", "where tokenized shards go (empty: OUTPUT_DIR/data)", data.cache_dir),
        COLOSSUS_KEY("format", "sft: JSONL record format: auto (from the first line's keys), chat, prompt_completion, text, preference", data.format),
        COLOSSUS_KEY("train_on", "sft: tokens with loss: auto (completion of prompt/completion records, all of text), assistant, completion, all", data.train_on),
        COLOSSUS_KEY("max_length", "sft: tokens kept per example (0: seq_len)", data.max_length),
        COLOSSUS_KEY("truncation", "sft: keep_start or keep_end of a longer example", data.truncation),
        COLOSSUS_KEY("skip_bad_lines", "sft: skip and count a bad JSONL line instead of stopping", data.skip_bad_lines),
        COLOSSUS_KEY("packing", "sft: several examples per seq_len row, positions restarting (else one a row, padded)", data.packing),
        COLOSSUS_KEY("tokenize_threads", "sft: tokenizing threads per rank", data.tokenize_threads)}});
    s.push_back({"optimizer", "", {
        COLOSSUS_KEY("name", "adamw | adam | sgd | lamb | hybrid_adam", optimizer.name),
        COLOSSUS_KEY("lr", "peak learning rate", optimizer.lr),
        COLOSSUS_KEY("weight_decay", "decoupled weight decay (adamw, lamb), L2 (adam, sgd)", optimizer.weight_decay),
        COLOSSUS_KEY("beta1", "first-moment decay (adam family, lamb)", optimizer.beta1),
        COLOSSUS_KEY("beta2", "second-moment decay (adam family, lamb)", optimizer.beta2),
        COLOSSUS_KEY("eps", "denominator epsilon (adam family, lamb)", optimizer.eps),
        COLOSSUS_KEY("momentum", "sgd momentum", optimizer.momentum),
        COLOSSUS_KEY("nesterov", "sgd Nesterov momentum", optimizer.nesterov),
        COLOSSUS_KEY("decay_1d_params", "false: biases and norm weights (1-D tensors) get no weight decay", optimizer.decay_1d_params)}});
    s.push_back({"lr_scheduler", "", {
        COLOSSUS_KEY("name", "constant | linear | cosine", lr_scheduler.name),
        COLOSSUS_KEY("warmup_steps", "linear warm-up steps from 0 to lr", lr_scheduler.warmup_steps),
        COLOSSUS_KEY("total_steps", "steps of the whole schedule (0: train.steps)", lr_scheduler.total_steps),
        COLOSSUS_KEY("min_lr_ratio", "cosine floor as a fraction of lr", lr_scheduler.min_lr_ratio)}});
    s.push_back({"plugin", "", {
        COLOSSUS_KEY("name", "ddp | low_level_zero | gemini | hybrid_parallel | moe_hybrid_parallel; the keys below depend on it", plugin.name)}});
    s.push_back({"plugin", "name = \"ddp\"", {
        COLOSSUS_KEY("broadcast_buffers", "buffers follow rank 0's at each forward", plugin.ddp.broadcast_buffers),
        COLOSSUS_KEY("bucket_cap_mb", "gradient bucket size in MB (all-reduced while backward runs)", plugin.ddp.bucket_cap_mb),
        COLOSSUS_KEY("find_unused_parameters", "parameters without a gradient in a step are allowed", plugin.ddp.find_unused_parameters),
        COLOSSUS_KEY("check_reduction", "accepted for compatibility; reduction is always checked", plugin.ddp.check_reduction),
        COLOSSUS_KEY("gradient_as_bucket_view", "gradients are views into the buckets (no copy)", plugin.ddp.gradient_as_bucket_view),
        COLOSSUS_KEY("static_graph", "accepted; buckets are built once and reused anyway", plugin.ddp.static_graph),
        COLOSSUS_KEY("fp8_communication", "gradients all-reduced in FP8 e4m3 with per-bucket scales (about half a bf16 all-reduce's bytes)", plugin.ddp.fp8_communication)}});
    s.push_back(
        {"plugin",
         "name = \"low_level_zero\"",
         {COLOSSUS_KEY("stage", "1: optimizer state sharded over dp; 2: gradients too", plugin.low_level_zero.stage),
          COLOSSUS_KEY("precision",
                       "fp16 (loss-scaled) | bf16 | fp32; replaces "
                       "booster.mixed_precision",
                       plugin.low_level_zero.precision),
          COLOSSUS_KEY("max_norm", "> 0: clip gradients to this global norm", plugin.low_level_zero.max_norm),
          COLOSSUS_KEY("norm_type", "2 or infinity", plugin.low_level_zero.norm_type),
          COLOSSUS_KEY("reduce_bucket_size_in_m", "million elements per reduce-scatter bucket",
                       plugin.low_level_zero.reduce_bucket_size_in_m),
          COLOSSUS_KEY("communication_dtype", "\"\" (the parameters' dtype) | fp32 | bf16 | fp16",
                       plugin.low_level_zero.communication_dtype),
          COLOSSUS_KEY("fp8_communication",
                       "gradients reduce-scattered and parameters all-gathered in FP8 "
                       "e4m3 with per-bucket scales (bf16/fp32; masters stay exact)",
                       plugin.low_level_zero.fp8_communication),
          COLOSSUS_KEY("overlap_communication", "reduce-scatter while backward runs",
                       plugin.low_level_zero.overlap_communication),
          COLOSSUS_KEY("overlap_allgather",
                       "all-gather updated parameters while the next forward "
                       "is prepared",
                       plugin.low_level_zero.overlap_allgather),
          COLOSSUS_KEY("cpu_offload", "fp32 masters, optimizer state and its update on the CPU",
                       plugin.low_level_zero.cpu_offload),
          COLOSSUS_KEY("master_weights", "false: bf16/fp16 shards are stepped directly",
                       plugin.low_level_zero.master_weights),
          COLOSSUS_KEY("extra_dp_size",
                       "> 1: state sharded over world/extra_dp_size ranks, "
                       "replicated over the groups",
                       plugin.low_level_zero.extra_dp_size)}});
    append_keys(s.back().keys, loss_scaler_keys("fp16: ", [](TrainConfig& c) -> amp::LossScalerOptions& {
                  return c.plugin.low_level_zero.loss_scaler;
                }));
    s.push_back(
        {"plugin",
         "name = \"gemini\"",
         {COLOSSUS_KEY("placement_policy", "static | auto", plugin.gemini.gemini.placement_policy),
          COLOSSUS_KEY("shard_param_frac", "static: share of chunks sharded (the rest stay gathered)",
                       plugin.gemini.gemini.shard_param_frac),
          COLOSSUS_KEY("offload_optim_frac",
                       "static: share of sharded chunks whose optimizer side "
                       "lives in host memory",
                       plugin.gemini.gemini.offload_optim_frac),
          COLOSSUS_KEY("offload_param_frac",
                       "static: share of sharded chunks whose parameter shard "
                       "lives in host memory",
                       plugin.gemini.gemini.offload_param_frac),
          COLOSSUS_KEY("warmup_non_model_data_ratio",
                       "auto: non-model share of device memory assumed in the "
                       "warm-up step",
                       plugin.gemini.gemini.warmup_non_model_data_ratio),
          COLOSSUS_KEY("steady_cuda_cap_ratio", "auto: share of device capacity chunks may use after warm-up",
                       plugin.gemini.gemini.steady_cuda_cap_ratio),
          margin_ratio_key(),
          COLOSSUS_KEY("precision",
                       "fp16 (loss-scaled) | bf16 | fp32; replaces "
                       "booster.mixed_precision",
                       plugin.gemini.gemini.precision),
          COLOSSUS_KEY("master_weights", "false: the bf16/fp16 shards are stepped directly",
                       plugin.gemini.gemini.master_weights),
          COLOSSUS_KEY("pin_memory", "host shards pinned (CUDA)", plugin.gemini.gemini.pin_memory),
          COLOSSUS_KEY("max_prefetch", "chunks all-gathered ahead of use", plugin.gemini.gemini.max_prefetch),
          COLOSSUS_KEY("enable_gradient_accumulation", "backward several times per step",
                       plugin.gemini.gemini.enable_gradient_accumulation),
          COLOSSUS_KEY("search_range_m", "chunk size search range, millions of elements", plugin.gemini.search_range_m),
          COLOSSUS_KEY("min_chunk_size_m", "smallest chunk, millions of elements", plugin.gemini.min_chunk_size_m),
          COLOSSUS_KEY("hidden_dim", "> 0: the chunk size search steps by this", plugin.gemini.hidden_dim),
          COLOSSUS_KEY("max_norm", "> 0: clip gradients to this global norm (over the shards)",
                       plugin.gemini.gemini.max_norm),
          COLOSSUS_KEY("norm_type", "2 or infinity", plugin.gemini.gemini.norm_type),
          COLOSSUS_KEY("nvme_offload_fraction",
                       "static: share of host-offloaded chunks whose moments "
                       "live in files",
                       plugin.gemini.gemini.nvme_offload_fraction),
          COLOSSUS_KEY("nvme_offload_dir", "directory of those files", plugin.gemini.gemini.nvme_offload_dir),
          COLOSSUS_KEY("nvme_direct_io",
                       "those files read and written with O_DIRECT from aligned buffers kept between steps; a "
                       "filesystem that refuses O_DIRECT gets buffered IO (one logged line); false: buffered IO",
                       plugin.gemini.gemini.nvme_direct_io),
          COLOSSUS_KEY("fp8_communication",
                       "gradients reduce-scattered and sharded chunks all-gathered in "
                       "FP8 e4m3 with per-chunk scales (bf16/fp32; shards stay exact)",
                       plugin.gemini.gemini.fp8_communication),
          COLOSSUS_KEY("lazy_init",
                       "seeded init on the meta device too, each rank materialising "
                       "only its shards (model.pretrained always loads lazily)",
                       plugin.lazy_init)}});
    append_keys(s.back().keys, loss_scaler_keys("fp16: ", [](TrainConfig& c) -> amp::LossScalerOptions& {
                  return c.plugin.gemini.gemini.loss_scaler;
                }));
    s.push_back({"plugin", "name = \"hybrid_parallel\"", {
        COLOSSUS_KEY("tp_size", "tensor-parallel ranks", plugin.hybrid_parallel.tp_size),
        COLOSSUS_KEY("pp_size", "pipeline stages", plugin.hybrid_parallel.pp_size),
        COLOSSUS_KEY("pp_style", "1f1b | interleaved | zero_bubble", plugin.hybrid_parallel.pp_style),
        COLOSSUS_KEY("num_model_chunks", "interleaved: virtual stages per rank", plugin.hybrid_parallel.num_model_chunks),
        COLOSSUS_KEY("num_microbatches", "microbatches per pipeline step (0: from microbatch_size)", plugin.hybrid_parallel.num_microbatches),
        COLOSSUS_KEY("microbatch_size", "rows per microbatch (0 with pp: data.batch_size)", plugin.hybrid_parallel.microbatch_size),
        COLOSSUS_KEY("overlap_p2p", "each pipeline receive is posted one action ahead", plugin.hybrid_parallel.overlap_p2p),
        COLOSSUS_KEY("gradient_checkpointing_ratio", "share of blocks that rerun their forward in backward", plugin.hybrid_parallel.gradient_checkpointing_ratio),
        COLOSSUS_KEY("gradient_checkpointing_granularity", "\"full\" (a checkpointed block reruns whole) or \"mlp\" (only its MLP)", plugin.hybrid_parallel.gradient_checkpointing_granularity),
        COLOSSUS_KEY("sp_size", "sequence-parallel ranks (ring_attn, all_to_all)", plugin.hybrid_parallel.sp_size),
        COLOSSUS_KEY("enable_sequence_parallelism", "shard the sequence (see sequence_parallelism_mode)", plugin.hybrid_parallel.enable_sequence_parallelism),
        COLOSSUS_KEY("sequence_parallelism_mode", "split_gather | ring | ring_attn | all_to_all", plugin.hybrid_parallel.sequence_parallelism_mode),
        COLOSSUS_KEY("inner_ring_size", "ring_attn: ranks per inner ring (0: one ring)", plugin.hybrid_parallel.inner_ring_size),
        COLOSSUS_KEY("zero_stage", "1: optimizer state and masters sharded over dp; 2: gradients too", plugin.hybrid_parallel.zero_stage),
        COLOSSUS_KEY("precision", "fp32 | bf16 | fp16 (loss-scaled); replaces booster.mixed_precision", plugin.hybrid_parallel.precision),
        COLOSSUS_KEY("max_norm", "> 0: clip gradients to this global norm", plugin.hybrid_parallel.max_norm),
        COLOSSUS_KEY("norm_type", "2 or infinity", plugin.hybrid_parallel.norm_type),
        COLOSSUS_KEY("parallel_output", "true: vocab-parallel logits and loss; false: logits gathered", plugin.hybrid_parallel.parallel_output),
        COLOSSUS_KEY("make_vocab_size_divisible_by", "vocab padded to a multiple of this x tp", plugin.hybrid_parallel.make_vocab_size_divisible_by),
        COLOSSUS_KEY("dp_outside", "mesh (dp, tp) with tp ranks adjacent; false: (tp, dp)", plugin.hybrid_parallel.dp_outside),
        COLOSSUS_KEY("bucket_cap_mb", "dp gradient bucket size in MB", plugin.hybrid_parallel.bucket_cap_mb)}});
    append_keys(s.back().keys, loss_scaler_keys("fp16: ", [](TrainConfig& c) -> amp::LossScalerOptions& {
                  return c.plugin.hybrid_parallel.loss_scaler;
                }));
    s.push_back({"plugin", "name = \"moe_hybrid_parallel\"", {
        COLOSSUS_KEY("ep_size", "expert-parallel ranks (divides the dp size world / (tp_size x pp_size) and the experts)", plugin.moe_hybrid_parallel.ep_size),
        COLOSSUS_KEY("moe_dp_outside", "mesh (moe_dp, ep) with an ep group's ranks adjacent; false: (ep, moe_dp)", plugin.moe_hybrid_parallel.moe_dp_outside),
        COLOSSUS_KEY("tp_size", "tensor-parallel ranks of attention, embedding and head (experts stay whole)", plugin.moe_hybrid_parallel.tp_size),
        COLOSSUS_KEY("pp_size", "pipeline stages", plugin.moe_hybrid_parallel.pp_size),
        COLOSSUS_KEY("pp_style", "1f1b | interleaved | zero_bubble", plugin.moe_hybrid_parallel.pp_style),
        COLOSSUS_KEY("num_model_chunks", "interleaved: virtual stages per rank", plugin.moe_hybrid_parallel.num_model_chunks),
        COLOSSUS_KEY("num_microbatches", "microbatches per pipeline step (0: from microbatch_size)", plugin.moe_hybrid_parallel.num_microbatches),
        COLOSSUS_KEY("microbatch_size", "rows per microbatch (0 with pp: data.batch_size)", plugin.moe_hybrid_parallel.microbatch_size),
        COLOSSUS_KEY("overlap_p2p", "each pipeline receive is posted one action ahead", plugin.moe_hybrid_parallel.overlap_p2p),
        COLOSSUS_KEY("make_vocab_size_divisible_by", "tp: vocab padded to a multiple of this x tp", plugin.moe_hybrid_parallel.make_vocab_size_divisible_by),
        COLOSSUS_KEY("zero_stage", "0: gradients all-reduced; 1: optimizer state sharded (dense over dp, experts over moe_dp); 2: gradients too", plugin.moe_hybrid_parallel.zero_stage),
        COLOSSUS_KEY("precision", "fp32 | bf16 | fp16 (loss-scaled); fp32 masters; replaces booster.mixed_precision", plugin.moe_hybrid_parallel.precision),
        COLOSSUS_KEY("max_norm", "> 0: clip gradients to this global norm (each element counted once)", plugin.moe_hybrid_parallel.max_norm),
        COLOSSUS_KEY("norm_type", "2 or infinity", plugin.moe_hybrid_parallel.norm_type),
        COLOSSUS_KEY("bucket_cap_mb", "zero_stage 0: all-reduce bucket size in MB", plugin.moe_hybrid_parallel.bucket_cap_mb),
        COLOSSUS_KEY("reduce_bucket_size_in_m", "zero_stage 1/2: million elements per reduce-scatter bucket", plugin.moe_hybrid_parallel.reduce_bucket_size_in_m),
        COLOSSUS_KEY("overlap_communication", "zero_stage 1/2: reduce-scatter while backward runs", plugin.moe_hybrid_parallel.overlap_communication),
        COLOSSUS_KEY("gradient_checkpointing_ratio", "share of blocks that rerun their forward in backward (wrapped after the expert and tp sharding)", plugin.moe_hybrid_parallel.gradient_checkpointing_ratio)}});
    s.back().keys.push_back(int_list_key(
        "num_layers_per_stage", "pp: decoder layers of each stage (empty: even split)",
        [](TrainConfig& c) -> std::vector<int64_t>& { return c.plugin.moe_hybrid_parallel.num_layers_per_stage; }));
    append_keys(s.back().keys, loss_scaler_keys("fp16: ", [](TrainConfig& c) -> amp::LossScalerOptions& {
                  return c.plugin.moe_hybrid_parallel.loss_scaler;
                }));
    s.push_back({"booster", "", {
        COLOSSUS_KEY("mixed_precision", "fp32 | bf16 | fp16 (fp32 masters; fp16 loss-scaled); plugins that own precision ignore it", booster.mixed_precision),
        COLOSSUS_KEY("max_norm", "> 0: clip gradients to this global norm before each step", booster.max_norm),
        COLOSSUS_KEY("norm_type", "2 or infinity", booster.norm_type)}});
    // booster.device: an optional device, read as a string.
    s.back().keys.push_back(Key{
        "device", "string", "cpu | cuda | cuda:N (empty: the cluster's device); plugins that place the model ignore it",
        [](SectionReader& r, TrainConfig& c) {
          std::string device;
          r.get("device", device);
          if (device.empty()) return;
          try {
            c.booster.device = c10::Device(device);
          } catch (const std::exception&) {
            throw ConfigError(
                fmt::format("booster.device = '{}' is not a device; use e.g. 'cpu', 'cuda' or 'cuda:1'", device));
          }
        },
        [](const TrainConfig& c, toml::table& t) {
          t.insert_or_assign("device", c.booster.device ? c.booster.device->str() : std::string());
        }});
    s.push_back({"booster.loss_scaler", "", loss_scaler_keys("fp16: ", [](TrainConfig& c) -> amp::LossScalerOptions& {
                   return c.booster.loss_scaler;
                 })});
    s.push_back({"train", "", {
        COLOSSUS_KEY("task", "pretrain (token streams), sft (JSONL records, loss on trained tokens) or dpo (preference records, [dpo])", train.task),
        COLOSSUS_KEY("steps", "optimizer steps in all (a resumed run continues to this)", train.steps),
        COLOSSUS_KEY("grad_accum", "micro-batches per optimizer step", train.grad_accum),
        COLOSSUS_KEY("seed", "seed of the data order and dropout", train.seed),
        COLOSSUS_KEY("deterministic", "deterministic kernels only: a run repeats bit for bit on the same GPU (torch.use_deterministic_algorithms)", train.deterministic),
        COLOSSUS_KEY("output_dir", "run directory: checkpoints/, metrics.jsonl, tensorboard/, loss.svg", train.output_dir),
        COLOSSUS_KEY("log_every", "steps between progress lines and metric records", train.log_every),
        COLOSSUS_KEY("eval_every", "steps between eval losses (0: only at the end)", train.eval_every),
        COLOSSUS_KEY("eval_batches", "eval batches per rank", train.eval_batches),
        COLOSSUS_KEY("save_every", "steps between checkpoints (0: only the final one)", train.save_every),
        COLOSSUS_KEY("save", "write checkpoints (false: none at all, for benchmarks and dry runs)", train.save),
        COLOSSUS_KEY("keep_last", "step checkpoints kept (older ones removed); 0 keeps all", train.keep_last),
        COLOSSUS_KEY("max_nonfinite_steps", "consecutive steps with a non-finite loss or gradients that stop the run", train.max_nonfinite_steps),
        COLOSSUS_KEY("async_save", "write checkpoints on a background thread while training goes on", train.async_save),
        COLOSSUS_KEY("cuda_graph", "capture the whole step in a CUDA graph (one GPU, bf16, ddp, grad_accum 1)", train.cuda_graph),
        COLOSSUS_KEY("size_per_shard_mb", "safetensors shard size of saved models", train.size_per_shard_mb),
        COLOSSUS_KEY("tensorboard", "write TensorBoard event files", train.tensorboard),
        COLOSSUS_KEY("backend", "auto | nccl | mpi", train.backend),
        COLOSSUS_KEY("peak_tflops", "per-GPU peak for the MFU figure", train.peak_tflops),
        COLOSSUS_KEY("sample_prompt", "text the trained model continues at the end (empty: none)", train.sample_prompt),
        COLOSSUS_KEY("sample_tokens", "tokens of that sample", train.sample_tokens),
        COLOSSUS_KEY("sample_temperature", "temperature of that sample (top-k 20; 0 = greedy)", train.sample_temperature)}});
    s.push_back({"dpo", "", {
        COLOSSUS_KEY("beta", "dpo: rewards are beta x (policy - reference) log-probs; larger keeps closer to the reference", dpo.beta),
        COLOSSUS_KEY("loss_type", "dpo: sigmoid (DPO), ipo, hinge, robust", dpo.loss_type),
        COLOSSUS_KEY("label_smoothing", "dpo: robust only, the share of preferences assumed flipped, in [0, 0.5)", dpo.label_smoothing)}});
    s.push_back({"lora", "", {
        COLOSSUS_KEY("r", "LoRA rank; 0 (the default) trains the whole model, > 0 only adapters on a frozen base", lora.r),
        COLOSSUS_KEY("lora_alpha", "adapter scaling numerator: scaling = lora_alpha / r (/ sqrt(r) with use_rslora)", lora.lora_alpha),
        COLOSSUS_KEY("lora_dropout", "dropout on the adapters' input, in [0, 1)", lora.lora_dropout),
        COLOSSUS_KEY("target_modules", "\"all-linear\" (every linear layer but the head) or comma-separated module names (\"q_proj,v_proj\")", lora.target_modules),
        COLOSSUS_KEY("modules_to_save", "modules trained whole beside the adapters, comma-separated (\"lm_head\"); saved in the adapter", lora.modules_to_save),
        COLOSSUS_KEY("bias", "biases that train: none, all, lora_only (those of the adapted layers)", lora.bias),
        COLOSSUS_KEY("use_rslora", "rank-stabilised scaling lora_alpha / sqrt(r)", lora.use_rslora),
        COLOSSUS_KEY("adapter", "a PEFT adapter directory to continue training (its adapter_config.json sets the options; leave r at 0)", lora.adapter),
        COLOSSUS_KEY("quantize", "\"nf4\": QLoRA, the base's linear layers held in 4-bit NF4 (double-quantised as bitsandbytes); \"\": as loaded", lora.quantize)}});
    return s;
  }();
  return all;
}

// The sections that apply to a config whose plugin is `plugin_name`.
bool applies(const Section& section, const std::string& plugin_name) {
  return section.when.empty() || section.when == fmt::format("name = \"{}\"", plugin_name);
}

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

// A config.json value (JSON) back as TOML, for --print_config.
void insert_json(toml::table& table, const std::string& key, const nlohmann::json& value);

toml::array json_array(const nlohmann::json& value) {
  toml::array array;
  for (const auto& item : value) {
    toml::table holder;
    insert_json(holder, "v", item);
    array.push_back(*holder.get("v"));
  }
  return array;
}

void insert_json(toml::table& table, const std::string& key, const nlohmann::json& value) {
  if (value.is_boolean()) {
    table.insert_or_assign(key, value.get<bool>());
  } else if (value.is_number_integer()) {
    table.insert_or_assign(key, value.get<int64_t>());
  } else if (value.is_number()) {
    table.insert_or_assign(key, value.get<double>());
  } else if (value.is_string()) {
    table.insert_or_assign(key, value.get<std::string>());
  } else if (value.is_array()) {
    table.insert_or_assign(key, json_array(value));
  } else if (value.is_object()) {
    toml::table inner;
    for (const auto& [k, v] : value.items()) insert_json(inner, k, v);
    table.insert_or_assign(key, std::move(inner));
  }
}

// A table cell: "|" would end it.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string default_text(const Key& key, const TrainConfig& defaults) {
  toml::table holder;
  key.write(defaults, holder);
  std::ostringstream out;
  out << toml::toml_formatter{holder};
  std::string text = out.str();  // "name = value\n"
  const auto eq = text.find(" = ");
  text = eq == std::string::npos ? text : text.substr(eq + 3);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

}  // namespace

TrainConfig read_config_tables(const toml::table& root) {
  TrainConfig config;
  SectionReader top(&root, "");
  // [model.config] passes through to config.json; read with [model].
  {
    SectionReader model(top.table("model"), "model");
    for (const Section& section : sections()) {
      if (section.path != "model") continue;
      for (const Key& key : section.keys) key.read(model, config);
    }
    if (const auto* overrides = model.table("config")) {
      for (auto&& [key, node] : *overrides) config.model.config[std::string(key.str())] = to_json_text(node);
    }
    model.finish();
  }
  // [plugin]: its name first, then the keys of that plugin (an unknown name
  // reads as ddp's keys; validate() then names the valid plugins).
  std::string plugin_name = config.plugin.name;
  if (const auto* plugin = root.get("plugin"); plugin && plugin->is_table()) {
    if (const auto* name = plugin->as_table()->get("name"); name && name->is_string()) {
      plugin_name = *name->value<std::string>();
    }
  }
  if (std::find(plugin_names().begin(), plugin_names().end(), plugin_name) == plugin_names().end()) plugin_name = "ddp";
  const std::vector<std::string> order = {"data", "optimizer", "lr_scheduler", "plugin", "booster", "train", "dpo", "lora"};
  for (const auto& path : order) {
    SectionReader reader(top.table(path.c_str()), path);
    for (const Section& section : sections()) {
      if (section.path != path || !applies(section, plugin_name)) continue;
      for (const Key& key : section.keys) key.read(reader, config);
    }
    if (path == "booster") {
      SectionReader scaler(reader.table("loss_scaler"), "booster.loss_scaler");
      for (const Section& section : sections()) {
        if (section.path != "booster.loss_scaler") continue;
        for (const Key& key : section.keys) key.read(scaler, config);
      }
      scaler.finish();
    }
    reader.finish();
  }
  top.finish();
  return config;
}

std::string effective_config_toml(const TrainConfig& config) {
  toml::table root;
  for (const Section& section : sections()) {
    const bool known =
        std::find(plugin_names().begin(), plugin_names().end(), config.plugin.name) != plugin_names().end();
    if (!applies(section, known ? config.plugin.name : "ddp")) continue;
    toml::table* table = &root;
    std::string rest = section.path;
    while (!rest.empty()) {
      const auto dot = rest.find('.');
      const std::string part = rest.substr(0, dot);
      rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
      if (!table->contains(part)) table->insert(part, toml::table{});
      table = table->get(part)->as_table();
    }
    for (const Key& key : section.keys) key.write(config, *table);
  }
  if (!config.model.config.empty()) {
    toml::table overrides;
    for (const auto& [key, json_text] : config.model.config) insert_json(overrides, key, nlohmann::json::parse(json_text));
    root.get("model")->as_table()->insert("config", std::move(overrides));
  }
  std::ostringstream out;
  out << toml::toml_formatter{root} << "\n";
  return out.str();
}

std::string config_reference_markdown() {
  const TrainConfig defaults;
  std::string text =
      "# Training config reference\n\n"
      "Every key of `colossus train`'s TOML config, with its type and default. Generated from the\n"
      "key lists in `colossus/apps/trainer/config_schema.cpp` by `colossus train --config_reference`;\n"
      "CI checks that this file equals the generated one. Any key can be overridden on the command\n"
      "line as `--section.key=value`; `colossus train CONFIG --print_config` prints the effective\n"
      "config. `[model.config]` takes config.json keys of the model (`n_layer`, `hidden_size`,\n"
      "`rope_theta`, ...), checked against the model type's known keys.\n";
  for (const Section& section : sections()) {
    text += fmt::format("\n## [{}]{}\n\n", section.path, section.when.empty() ? "" : " with " + section.when);
    text += "| key | type | default | description |\n|---|---|---|---|\n";
    for (const Key& key : section.keys) {
      text += fmt::format("| `{}` | {} | `{}` | {} |\n", key.name, key.type, default_text(key, defaults), cell(key.doc));
    }
  }
  return text;
}

}  // namespace colossus::apps
