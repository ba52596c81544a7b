#include "colossus/apps/trainer/trainer.h"

#include "colossus/amp/graphed_train_step.h"

#include "colossus/apps/trainer/checkpoint_dirs.h"
#include "colossus/apps/trainer/config_schema.h"
#include "colossus/apps/trainer/components.h"
#include "colossus/apps/trainer/dpo_loss.h"
#include "colossus/apps/trainer/run_reporter.h"
#include "colossus/apps/trainer/sft_batches.h"
#include "colossus/apps/trainer/train_state.h"
#include "colossus/apps/trainer/training_data.h"
#include "colossus/booster/booster.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/booster/gemini_plugin.h"
#include "colossus/booster/low_level_zero_plugin.h"
#include "colossus/moe/moe_hybrid_parallel_plugin.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/cluster/fp8_collectives.h"
#include "colossus/cluster/launch.h"
#include "colossus/cluster/logger.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/data/sft_stream.h"
#include "colossus/inference/generate.h"
#include "colossus/lora/inject.h"
#include "colossus/lora/nf4_linear.h"
#include "colossus/lora/peft_io.h"
#include "colossus/metrics/memory.h"
#include "colossus/models/config.h"
#include "colossus/models/deepseek.h"
#include "colossus/models/deepseek_moe.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/fp8_linear.h"
#include "colossus/models/lazy_init.h"
#include "colossus/models/pretrained.h"
#include "colossus/zero/gemini/gemini_optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

namespace colossus::apps {

namespace fs = std::filesystem;

namespace {

const cluster::Logger log("train");

// The [plugin] section's plugin over `world` (validated with the config).
std::shared_ptr<booster::Plugin> make_plugin(const PluginSection& section, cluster::ProcessGroupPtr world) {
  if (section.name == "low_level_zero") return std::make_shared<booster::LowLevelZeroPlugin>(section.low_level_zero, world);
  if (section.name == "gemini") return std::make_shared<booster::GeminiPlugin>(section.gemini, world);
  if (section.name == "hybrid_parallel") {
    return std::make_shared<booster::HybridParallelPlugin>(section.hybrid_parallel, world);
  }
  if (section.name == "moe_hybrid_parallel") {
    return std::make_shared<moe::MoeHybridParallelPlugin>(section.moe_hybrid_parallel, world);
  }
  return std::make_shared<booster::DDPPlugin>(section.ddp, world);
}

// SIGINT/SIGTERM ask the loop to stop at the next step boundary with a
// checkpoint; the flag is combined over ranks so all of them stop together.
std::atomic<bool> stop_requested{false};
extern "C" void on_stop_signal(int) { stop_requested.store(true); }

class StopSignalScope {
 public:
  StopSignalScope() {
    stop_requested.store(false);
    previous_int_ = std::signal(SIGINT, on_stop_signal);
    previous_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignalScope() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
};

// Whether the optimizer's last step met non-finite gradients that no loss
// scaler accounts for: a bf16 mixed-precision step skipped for them, or a
// non-finite clipped norm. Reads only what the step already brought to the
// host; in device-step mode (CUDA graph) nothing is read and the loss alone
// decides. fp16 steps the scaler skips are its normal work and do not count.
bool nonfinite_gradients(const optim::Optimizer& optimizer, bool device_step) {
  return !device_step && optimizer.last_step_nonfinite();
}

// How the ranks split the work, for the start-up log: "dp 2 x pp 2 x tp 2 x sp 1 (ring_attn)".
std::string parallel_layout(const TrainConfig& c, int world, int64_t dp) {
  if (c.plugin.name == "hybrid_parallel") {
    const auto& h = c.plugin.hybrid_parallel;
    std::string sp = "sp 1";
    if (h.enable_sequence_parallelism) {
      const bool over_tp = h.sequence_parallelism_mode == "split_gather" || h.sequence_parallelism_mode == "ring";
      sp = over_tp ? fmt::format("sequence over tp ({})", h.sequence_parallelism_mode)
                   : fmt::format("sp {} ({})", h.sp_size, h.sequence_parallelism_mode);
    }
    return fmt::format("{} rank(s): dp {} x pp {} x tp {} x {}{}", world, dp, h.pp_size, h.tp_size, sp,
                       h.zero_stage > 0 ? fmt::format(", ZeRO-{} over dp", h.zero_stage) : "");
  }
  if (c.plugin.name == "moe_hybrid_parallel") {
    const auto& m = c.plugin.moe_hybrid_parallel;
    return fmt::format("{} rank(s): dp {} (moe_dp {} x ep {}) x pp {} x tp {}{}", world, dp, dp / m.ep_size,
                       m.ep_size, m.pp_size, m.tp_size,
                       m.zero_stage > 0 ? fmt::format(", ZeRO-{} (dense over dp, experts over moe_dp)", m.zero_stage)
                                        : "");
  }
  if (c.plugin.name == "low_level_zero")
    return fmt::format("{} rank(s): dp {}, ZeRO-{}{}", world, dp, c.plugin.low_level_zero.stage,
                       c.plugin.low_level_zero.cpu_offload ? " with the optimizer on the CPU" : "");
  if (c.plugin.name == "gemini")
    return fmt::format("{} rank(s): dp {}, Gemini (ZeRO-3 chunks, placement {})", world, dp,
                       c.plugin.gemini.gemini.placement_policy);
  return fmt::format("{} rank(s): dp {} ({})", world, dp, c.plugin.name);
}

// The parameters' precision: a plugin's own precision replaces the booster's.
std::string run_precision(const TrainConfig& c) {
  if (c.plugin.name == "low_level_zero") return c.plugin.low_level_zero.precision;
  if (c.plugin.name == "gemini") return c.plugin.gemini.gemini.precision;
  if (c.plugin.name == "hybrid_parallel") return c.plugin.hybrid_parallel.precision;
  if (c.plugin.name == "moe_hybrid_parallel") return c.plugin.moe_hybrid_parallel.precision;
  return c.booster.mixed_precision;
}

class Trainer {
 public:
  Trainer(const TrainConfig& config, const TrainOptions& options)
      : config_(config), options_(options), dirs_(config.train.output_dir) {}

  TrainResult run();

 private:
  void build();
  void resume_from(const std::string& dir);
  // Pretraining: the loader position in `saved` is where its step ends.
  void check_data_position(const std::string& dir, const TrainState& saved) const;
  // Mean loss over the held-out split (eval_batches per rank), all ranks combined.
  double evaluate();
  void save_checkpoint(int64_t step);
  // Collective: true when the last step's loss and this run's parameters are
  // finite on every rank, so that a checkpoint of them may be published.
  bool state_is_finite();
  // Continues train.sample_prompt with the trained model (rank 0 only).
  void print_sample();
  void publish_pending_checkpoint();
  // train.cuda_graph: the captured step, or nothing when it is off; a
  // ConfigError when the run cannot have one.
  std::optional<amp::GraphedTrainStep> make_graphed_step();
  int64_t global_batch_tokens() const {
    return config_.data.batch_size * config_.data.seq_len * config_.train.grad_accum * dp_size_;
  }
  // sft and dpo read JSONL records through the example stream.
  bool reads_records() const { return config_.train.task != "pretrain"; }
  bool dpo() const { return config_.train.task == "dpo"; }
  // This rank's examples of the step's batch_size x grad_accum x dp (every
  // rank reads them all), by micro-batch; adds their tokens to `tokens` and
  // their targets to `targets`.
  std::vector<std::vector<data::SftExample>> take_step_examples(int64_t& tokens, int64_t& targets);
  // One sft step's forward and backward over grad_accum micro-batches; returns
  // this rank's share of the step's loss (the global per-token mean is the
  // sum over ranks) and adds the step's tokens to tokens.
  at::Tensor sft_forward_backward(int64_t& tokens);
  // One dpo step: returns this rank's mean loss over its pairs and adds the
  // step's chosen/rejected reward means, reward accuracy and margin to
  // dpo_metrics_since_log_.
  at::Tensor dpo_forward_backward(int64_t& tokens);
  // fetch(), its wall time added to data_wait_since_log_ (run metrics).
  template <typename Fetch>
  auto waiting_for_data(Fetch&& fetch) {
    const auto start = std::chrono::steady_clock::now();
    auto batch = fetch();
    data_wait_since_log_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return batch;
  }
  double data_wait_since_log_ = 0.0;
  std::string precision_;  // the run's parameter precision: fp32, bf16, fp16
  // example_logps of the policy model's logits, sequence-sharded or not.
  at::Tensor policy_logps(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& example_ids,
                          int64_t examples);
  // dpo under pipeline parallelism: the step's pairs as one pipeline batch.
  at::Tensor dpo_pipeline_step(const std::vector<std::vector<data::SftExample>>& micro_batches);
  // DeepSeek-V3's aux-loss-free balancing after an optimizer step: each
  // router's bias moves against its experts' load summed over the
  // data-parallel ranks, so every rank makes the same move.
  void update_router_biases();
  // fp8_communication: the bytes the first step's fp8 collectives sent, into
  // `result` and logged once.
  void report_fp8_wire_bytes(const cluster::Fp8WireBytes& at_start, TrainResult& result) const;
  // dpo: the frozen reference, the policy as it was loaded, in the working dtype.
  void build_reference_model(const models::ModelConfig& model_config);

  TrainConfig config_;
  TrainOptions options_;
  CheckpointDirs dirs_;
  cluster::ProcessGroupPtr world_;
  cluster::ProcessGroupPtr dp_;
  int64_t dp_size_ = 1;
  bool pipeline_ = false;  // hybrid_parallel with pp_size > 1: steps are booster.execute_pipeline
  c10::Device device_{c10::kCPU};

  std::unique_ptr<data::Tokenizer> tokenizer_;
  // SFT renders conversations with the tokenizer directory's template (declared before the stream that uses it).
  std::optional<data::chat::ChatTemplate> chat_template_;
  TokenizedData data_;
  // train.task = "sft": the example stream, identical on every rank (each
  // micro-batch takes its rank's slice of the next batch_size x dp examples,
  // so the position is global and every rank knows the step's target count).
  std::unique_ptr<data::SftExampleStream> sft_stream_;
  int32_t pad_id_ = 0;
  std::shared_ptr<models::CausalLM> reference_model_;  // dpo only
  lora::LoraConfig lora_config_;                        // [lora]: the applied config, all-linear resolved
  at::Tensor dpo_metrics_since_log_;                    // dpo: (4) summed per step, see dpo_forward_backward
  std::shared_ptr<booster::Plugin> plugin_;
  std::unique_ptr<booster::Booster> booster_;
  booster::Boosted boosted_;
  std::shared_ptr<data::DataLoader> eval_loader_;
  double flops_per_token_ = 0.0;

  TrainState state_;
  // Consecutive steps with a non-finite loss or gradients, and the longest
  // such run so far: device scalars, so a step needs no host sync.
  at::Tensor nonfinite_run_;
  at::Tensor nonfinite_longest_;
  std::optional<int64_t> pending_publish_;  // an async checkpoint still being written
  std::unique_ptr<RunReporter> reporter_;
};

void Trainer::build() {
  const auto& cluster = cluster::launch_from_env({.backend = config_.train.backend});
  world_ = cluster.world;
  const bool fresh = options_.resume.empty();
  // Every rank checks, before anything is written, so all of them stop alike.
  if (fresh) dirs_.require_no_checkpoints();
  at::manual_seed(config_.train.seed);
  if (config_.train.deterministic) {
    // cuBLAS reads this when it makes its first handle (no GEMM has run
    // yet); a value the user set is kept.
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  if (world_->rank() == 0) {
    fs::create_directories(config_.train.output_dir);
    // Debris of crashed saves; nothing of this run is being written yet.
    for (const auto& path : dirs_.remove_stale()) log.info(fmt::format("removed {}, left by an interrupted save", path));
  }
  world_->barrier().wait();

  tokenizer_ = make_tokenizer(config_.data);
  if (reads_records()) {
    chat_template_ = find_chat_template(config_.data);
    const int64_t max_length = config_.data.max_length > 0 ? config_.data.max_length : config_.data.seq_len;
    sft_stream_ = std::make_unique<data::SftExampleStream>(
        config_.data.source,
        data::JsonlSourceOptions{.format = config_.data.format, .skip_bad_lines = config_.data.skip_bad_lines},
        data::SftExampleBuilder(*tokenizer_,
                                {.train_on = data::parse_train_on(config_.data.train_on),
                                 .max_length = max_length,
                                 .truncation = data::parse_truncation(config_.data.truncation),
                                 .preference_pairs = dpo()},
                                chat_template_ ? &*chat_template_ : nullptr),
        data::SftStreamOptions{.threads = config_.data.tokenize_threads,
                               .shuffle_seed = config_.data.shuffle ? std::optional<uint64_t>(config_.train.seed)
                                                                    : std::nullopt});
    pad_id_ = tokenizer_->pad_id().value_or(tokenizer_->eos_id().value_or(0));
  } else {
    data_ = prepare_training_data(config_, *tokenizer_, *world_);
  }
  auto model_config = build_model_config(config_, *tokenizer_);
  precision_ = run_precision(config_);
  if (config_.plugin.name == "moe_hybrid_parallel" && std::holds_alternative<models::DeepseekConfig>(model_config)) {
    throw ConfigError(fmt::format(
        "plugin.name = \"moe_hybrid_parallel\" does not take DeepSeek models yet (model type '{}': its routed "
        "experts are not sharded over ep); train it with plugin.name = \"ddp\", \"low_level_zero\" or \"gemini\", "
        "or use a Mixtral / Qwen2-MoE / Qwen3-MoE model with moe_hybrid_parallel",
        models::model_type(model_config)));
  }
  if (config_.plugin.name == "moe_hybrid_parallel" && !std::holds_alternative<models::MixtralConfig>(model_config)) {
    // Refused here, before the plugin lays out ranks or anything is allocated.
    throw ConfigError(fmt::format(
        "plugin.name = \"moe_hybrid_parallel\" needs a mixture-of-experts model (model_type mixtral: "
        "model.preset = \"mixtral-tiny\" or a pretrained Mixtral); model type '{}' is dense: use plugin.name = "
        "\"hybrid_parallel\" for it",
        models::model_type(model_config)));
  }
  plugin_ = make_plugin(config_.plugin, world_);
  pipeline_ = plugin_->pipeline_parallel();
  booster_ = std::make_unique<booster::Booster>(plugin_, config_.booster);
  // Lazy: a meta model, and each rank reads from the source (the pretrained
  // checkpoint, mapped; or the seeded init with gemini's lazy_init) only what
  // its plugin keeps, in its working dtype; never the whole model in fp32.
  const bool pretrained = !config_.model.pretrained.empty();
  // LoRA wraps layers of a whole model (loaded, then adapters added), so its
  // base is not lazy: the plugin gets it materialised.
  const bool lora = config_.lora.enabled();
  const bool lazy = !lora && (pretrained || config_.plugin.lazy_init);
  auto model = lazy ? models::create_lazy_model(model_config)
               : lora && pretrained ? models::load_pretrained(config_.model.pretrained)
                                    : models::create_model(model_config, {.seed = config_.model.init_seed});
  if (lora) {
    if (config_.lora.quantize == "nf4") {
      const int64_t quantized = lora::quantize_base_nf4(*model);
      log.info(fmt::format("lora: {} linear layers of the base held in NF4 (QLoRA)", quantized));
    }
    lora_config_ = config_.lora.adapter.empty()
                       ? booster_->enable_lora(*model, lora_config(config_.lora), config_.model.init_seed)
                       : lora::load_peft_adapter(*model, config_.lora.adapter);
    if (dpo() && (!lora_config_.modules_to_save.empty() || lora_config_.bias != "none")) {
      // The reference is the adapters' snapshot; biases and saved modules train in place.
      throw ConfigError(fmt::format(
          "train.task = \"dpo\" with LoRA modules_to_save {} / bias \"{}\" is not supported: the reference is the "
          "adapter as it started and those train in place; use no modules_to_save and bias \"none\"",
          lora_config_.modules_to_save, lora_config_.bias));
    }
    if (dpo()) lora::snapshot_adapters(*model);
    if (lora_config_.base_model_name_or_path.empty()) lora_config_.base_model_name_or_path = config_.model.pretrained;
    int64_t trained = 0, total = 0;
    for (const auto& p : model->parameters()) (p.requires_grad() ? trained : total) += p.numel();
    total += trained;
    log.info(fmt::format("lora: r {} on {} layers; {} of {} parameters train ({:.2f}%)", lora_config_.r,
                         lora::lora_layers(*model).size(), trained, total,
                         100.0 * static_cast<double>(trained) / static_cast<double>(total)));
  }
  if (config_.model.use_fp8) {
    const int64_t fp8 = models::enable_fp8(
        *model,
        {.rowwise = config_.model.fp8_scaling == "rowwise",
         .grad_format = config_.model.fp8_grad_format,
         .amax_history_len = config_.model.fp8_amax_history_len,
         // Gemini releases gathered weights between forward and backward;
         // keeping their FP8 copies would hold a byte a parameter.
         .keep_weight_for_backward = config_.plugin.name != "gemini"},
        config_.model.fp8_keep_first_last);
    log.info(fmt::format("fp8: {} linear layers run their matmuls in FP8 ({}{}, gradients in {})", fp8,
                         config_.model.fp8_scaling,
                         config_.model.fp8_amax_history_len > 0
                             ? fmt::format(", delayed over {} maxima", config_.model.fp8_amax_history_len)
                             : "",
                         config_.model.fp8_grad_format));
  }
  if (config_.model.gradient_checkpointing_ratio > 0.0) {
    const auto granularity = models::parse_checkpoint_granularity(config_.model.gradient_checkpointing_granularity);
    const int64_t wrapped =
        models::enable_activation_checkpointing(*model, config_.model.gradient_checkpointing_ratio, granularity);
    log.info(fmt::format("activation checkpointing: {} block(s) rerun {} in backward", wrapped,
                         granularity == models::CheckpointGranularity::Full ? "their forward" : "their MLP"));
  }
  models::ParamSource param_source;
  if (lazy) {
    param_source = pretrained ? models::checkpoint_source(*model, config_.model.pretrained)
                              : models::seeded_source(model, config_.model.init_seed);
  }
  flops_per_token_ = flops_per_token(*model, config_.data.seq_len);
  auto optimizer = build_optimizer(config_.optimizer, *model);
  auto scheduler = build_lr_scheduler(config_.lr_scheduler, *optimizer, config_.train.steps);

  device_ = booster_->device();
  // With LoRA the reference is the policy with its adapters as they started
  // (snapshot before boosting; TRL keeps such a copy of a PEFT adapter): no second base.
  if (dpo() && !config_.lora.enabled()) build_reference_model(model_config);
  dp_ = plugin_->dp_group();
  dp_size_ = dp_->size();

  const data::DataLoaderOptions loader_options{.batch_size = config_.data.batch_size,
                                               .prefetch = config_.data.prefetch,
                                               .pin_memory = device_.is_cuda()};
  std::shared_ptr<data::DataLoader> loader;
  if (!reads_records()) {
    auto train_set = std::make_shared<data::TokenDataset>(data::TokenDataset::from_dir(data_.train_dir, config_.data.seq_len));
    loader = booster_->prepare_dataloader(train_set, loader_options, config_.train.seed, config_.data.shuffle);
  }
  if (!data_.eval_dir.empty() && config_.train.eval_batches > 0) {
    auto eval_set = std::make_shared<data::TokenDataset>(data::TokenDataset::from_dir(data_.eval_dir, config_.data.seq_len));
    // Too little held-out text for one batch per rank: no eval rather than an error.
    if (eval_set->size() >= config_.data.batch_size * dp_size_) {
      eval_loader_ = booster_->prepare_dataloader(eval_set, loader_options, /*seed=*/0, /*shuffle=*/false);
    } else {
      log.warning(fmt::format("the eval split has {} samples of {} tokens, fewer than one batch per rank; no eval "
                              "loss (raise data.eval_fraction or lower data.batch_size)",
                              eval_set->size(), config_.data.seq_len));
    }
  }
  boosted_ = booster_->boost(std::move(model), std::move(optimizer), scheduler, loader, param_source);
  if (auto* gemini = dynamic_cast<zero::gemini::GeminiOptimizer*>(boosted_.optimizer.get());
      gemini != nullptr && gemini->ddp().host_step_enabled()) {
    log.info("gemini: the host step is on (bf16, hybrid_adam): chunks whose optimizer side is on the host keep the "
             "bf16 gradient there and update chunk by chunk as their copies land");
  }

  state_.dp_size = dp_size_;
  state_.micro_batch = config_.data.batch_size;
  state_.grad_accum = config_.train.grad_accum;
  state_.seq_len = config_.data.seq_len;
  if (!fresh) {
    if (auto point = resolve_resume_dir(options_.resume, dirs_)) {
      if (!point->note.empty()) log.warning(point->note);
      resume_from(point->dir);
    } else {
      log.info(fmt::format("no checkpoint in {} yet; starting from step 0", dirs_.root()));
    }
  }
  if (world_->rank() == 0) {
    std::ofstream(fs::path(config_.train.output_dir) / "config.toml") << config_.toml_text;
  }
  int64_t params = 0;
  // The parameters' dtype: a plugin may own precision (low_level_zero, hybrid_parallel).
  std::string precision = "fp32";
  for (const auto& p : boosted_.model->unwrap().parameters()) {
    params += p.numel();
    const auto of_param = precision_of(p.scalar_type());
    if (of_param && *of_param != Precision::kFp32) precision = precision_name(*of_param);
  }
  log.info(fmt::format("{} ({:.2f}M parameters), plugin {} on {} rank(s), {} on {}, global batch {} x {} tokens "
                       "({} per rank x {} accumulation x {} dp)",
                       models::model_type(model_config), static_cast<double>(params) / 1e6, plugin_->name(),
                       world_->size(), precision, device_.str(),
                       config_.data.batch_size * config_.train.grad_accum * dp_size_, config_.data.seq_len,
                       config_.data.batch_size, config_.train.grad_accum, dp_size_));
  log.info("layout: " + parallel_layout(config_, world_->size(), dp_size_));
  // The config as it runs (defaults filled, overrides applied): what a
  // reader of the log needs to reproduce the run (also in OUTPUT_DIR/config.toml).
  log.info("effective config:\n" + effective_config_toml(config_));
  reporter_ = std::make_unique<RunReporter>(config_, world_->rank(), state_.step, device_);
}

void Trainer::check_data_position(const std::string& dir, const TrainState& saved) const {
  // Each step reads grad_accum batches, so the data position follows from the step.
  const int64_t per_epoch = boosted_.dataloader->batches_per_epoch();
  int64_t batches = 0;
  if (__builtin_mul_overflow(saved.data_epoch, per_epoch, &batches) ||
      __builtin_add_overflow(batches, saved.data_position, &batches) ||
      batches != saved.step * saved.grad_accum || saved.data_position >= per_epoch) {
    throw CheckpointError(fmt::format("{}/train_state.json: data position (epoch {}, batch {}) at {} batches per epoch "
                                      "is not where step {} x grad_accum {} ends; the checkpoint is corrupt or the "
                                      "dataset changed",
                                      dir, saved.data_epoch, saved.data_position, per_epoch, saved.step,
                                      saved.grad_accum));
  }
}

void Trainer::resume_from(const std::string& dir) {
  const auto saved = TrainState::load((fs::path(dir) / "train_state.json").string());
  if (saved.dp_size != state_.dp_size || saved.micro_batch != state_.micro_batch ||
      saved.grad_accum != state_.grad_accum || saved.seq_len != state_.seq_len) {
    throw CheckpointError(fmt::format(
        "{} was saved with dp={} batch_size={} grad_accum={} seq_len={}, this run has dp={} batch_size={} "
        "grad_accum={} seq_len={}; resume with the same data layout so the data order continues exactly",
        dir, saved.dp_size, saved.micro_batch, saved.grad_accum, saved.seq_len, state_.dp_size, state_.micro_batch,
        state_.grad_accum, state_.seq_len));
  }
  // A step directory's name and its state agree, or the state is not its own.
  const auto name = fs::path(dir).filename().string();
  if (is_step_dir_name(name) && step_of_dir(name) != saved.step) {
    throw CheckpointError(fmt::format("{}/train_state.json says step {}, but the directory is step {}; the "
                                      "checkpoint is corrupt",
                                      dir, saved.step, step_of_dir(name)));
  }
  if (reads_records() != !saved.sft_position.empty()) {
    throw CheckpointError(fmt::format("{} is a {} checkpoint but this run's train.task is {}; resume it with the task "
                                      "it was made with",
                                      dir, saved.sft_position.empty() ? "pretraining" : "sft or dpo",
                                      config_.train.task));
  }
  if (reads_records()) {
    sft_stream_->seek(data::SftStreamPosition::from_json(nlohmann::json::parse(saved.sft_position)));
  } else {
    check_data_position(dir, saved);
  }
  booster_->load_model(*boosted_.model, (fs::path(dir) / "model").string());
  booster_->load_optimizer(*boosted_.optimizer, (fs::path(dir) / "optimizer").string());
  booster_->load_lr_scheduler(*boosted_.lr_scheduler, (fs::path(dir) / "lr_scheduler.json").string());
  if (boosted_.lr_scheduler->last_step() != saved.step) {
    throw CheckpointError(fmt::format("{}/lr_scheduler.json is at step {}, but train_state.json at step {}; the "
                                      "checkpoint is corrupt",
                                      dir, boosted_.lr_scheduler->last_step(), saved.step));
  }
  load_rng_state((fs::path(dir) / "rng" / fmt::format("rank-{:05d}.safetensors", world_->rank())).string(), device_);
  if (!reads_records()) boosted_.dataloader->set_state(saved.data_epoch, saved.data_position);
  state_ = saved;
  log.info(fmt::format("resumed from {} at step {}", dir, state_.step));
}

double Trainer::evaluate() {
  if (!eval_loader_) return std::nan("");
  c10::NoGradGuard no_grad;
  // Dropout off, and no draw from the generator, so evaluating never changes
  // the training run that follows.
  auto& model = boosted_.model->unwrap();
  model.eval();
  eval_loader_->set_state(0, 0);
  const int64_t batches = std::min(config_.train.eval_batches, eval_loader_->batches_per_epoch());
  auto total = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (int64_t i = 0; i < batches; ++i) {
    auto ids = eval_loader_->next().to(device_, /*non_blocking=*/true);
    // A pipeline's forward is a schedule: under the NoGradGuard
    // execute_pipeline runs forwards only and every pp rank gets the loss.
    auto loss = pipeline_ ? booster_->execute_pipeline([&] { return booster::PipelineBatch{.input_ids = ids}; },
                                                       *boosted_.model, {}, *boosted_.optimizer)
                                .loss
                          : boosted_.model->forward_loss(ids, ids);
    total[0] += loss.detach().to(at::kDouble);
    total[1] += 1.0;
  }
  model.train();
  dp_->all_reduce(total).wait();
  auto host = total.cpu();
  return host[0].item<double>() / host[1].item<double>();
}

bool Trainer::state_is_finite() {
  // [last step's loss was non-finite, some parameter is non-finite], summed over ranks.
  auto flags = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device_));
  flags[0] = at::gt(nonfinite_run_, 0.0).to(at::kDouble);
  c10::NoGradGuard no_grad;
  for (const auto& group : boosted_.optimizer->param_groups()) {
    for (const auto& p : group.params) {
      // Parameters whose storage a plugin released (gathered on demand) hold nothing to check.
      if (p.numel() == 0 || p.is_meta() || p.storage().nbytes() < p.nbytes()) continue;
      flags[1] += at::logical_not(at::isfinite(p)).any().to(at::kDouble);
    }
  }
  world_->all_reduce(flags).wait();
  auto host = flags.cpu();
  return host[0].item<double>() == 0.0 && host[1].item<double>() == 0.0;
}

void Trainer::save_checkpoint(int64_t step) {
  publish_pending_checkpoint();  // at most one save in flight
  const auto partial = dirs_.partial_dir(step);
  if (world_->rank() == 0) {
    checkpoint::io::remove_tree(partial);  // debris of a crashed save
    fs::create_directories(partial);
  }
  world_->barrier().wait();
  const booster::SaveOptions save{.size_per_shard_mb = config_.train.size_per_shard_mb,
                                  .use_async = config_.train.async_save};
  const auto model_dir = (fs::path(partial) / "model").string();
  booster_->save_model(*boosted_.model, model_dir, save);
  booster_->save_optimizer(*boosted_.optimizer, (fs::path(partial) / "optimizer").string(), save);
  booster_->save_lr_scheduler(*boosted_.lr_scheduler, (fs::path(partial) / "lr_scheduler.json").string());
  save_rng_state((fs::path(partial) / "rng" / fmt::format("rank-{:05d}.safetensors", world_->rank())).string(), device_);
  if (world_->rank() == 0) {
    fs::create_directories(model_dir);
    save_tokenizer_files(config_.data, model_dir);
    if (reads_records()) {
      state_.sft_position = sft_stream_->position().to_json().dump();
    } else {
      state_.data_epoch = boosted_.dataloader->epoch();
      state_.data_position = boosted_.dataloader->position();
    }
    state_.save((fs::path(partial) / "train_state.json").string());
  }
  pending_publish_ = step;
  if (!config_.train.async_save) publish_pending_checkpoint();
}

void Trainer::publish_pending_checkpoint() {
  if (!pending_publish_) return;
  booster_->wait_for_saves();
  world_->barrier().wait();  // every rank's files are on disk
  if (world_->rank() == 0) {
    if (config_.lora.enabled()) {
      // The adapters in PEFT's format beside model/, read back from what the
      // plugin saved (a gemini rank 0 holds only its chunk shards).
      const fs::path partial = dirs_.partial_dir(*pending_publish_);
      const std::string model_dir = (partial / "model").string();
      auto& model = boosted_.model->unwrap();
      const auto weights = checkpoint::load_tensors(model_dir, lora::lora_parameter_names(model, lora_config_));
      lora::save_peft_adapter(model, lora_config_, (partial / "adapter").string(), weights);
    }
    dirs_.publish(*pending_publish_, config_.train.keep_last);
    reporter_->on_checkpoint(*pending_publish_, dirs_.step_dir(*pending_publish_));
  }
  world_->barrier().wait();
  pending_publish_.reset();
}

void Trainer::print_sample() {
  std::vector<int64_t> prompt;
  for (int32_t id : tokenizer_->encode(config_.train.sample_prompt)) prompt.push_back(id);
  if (prompt.empty()) return;
  inference::GenerateOptions options{.max_new_tokens = config_.train.sample_tokens,
                                     .sampling = {.temperature = config_.train.sample_temperature, .top_k = 20, .seed = config_.train.seed},
                                     .eos_id = tokenizer_->eos_id()};
  // The plain model: the DDP wrapper's forward would broadcast buffers, a
  // collective the other ranks are not in.
  auto ids = inference::generate(boosted_.model->unwrap(), prompt, options);
  std::vector<int32_t> text_ids(ids.begin(), ids.end());
  log.info(fmt::format("sample (temperature {}, top-k 20):\n{}", config_.train.sample_temperature,
                       tokenizer_->decode(text_ids, true)));
}

std::optional<amp::GraphedTrainStep> Trainer::make_graphed_step() {
  if (!config_.train.cuda_graph) return std::nullopt;
  // The booster's own fp32 masters (a mixed-precision optimizer) are what the captured step updates.
  const bool mixed = !plugin_->control_precision() && config_.booster.mixed_precision != "fp32";
  if (!device_.is_cuda() || world_->size() != 1 || pipeline_ || config_.train.grad_accum != 1 || !mixed) {
    throw ConfigError(fmt::format(
        "train.cuda_graph = true captures one process's whole step on a GPU; this run has device {}, {} rank(s), "
        "grad_accum {}, plugin '{}' with {}; use one GPU, grad_accum = 1, the ddp plugin and booster.mixed_precision "
        "= \"bf16\" (or set train.cuda_graph = false)",
        device_.str(), world_->size(), config_.train.grad_accum, config_.plugin.name,
        mixed ? "mixed precision" : "no mixed-precision optimizer"));
  }
  // At world size 1 the DDP wrapper has nothing to reduce: the plain model's
  // loss keeps its hooks out of the captured step.
  models::CausalLM& plain = boosted_.model->unwrap();
  return std::make_optional<amp::GraphedTrainStep>(
      [&plain](const at::Tensor& ids) { return plain.forward_loss(ids, ids); }, *boosted_.optimizer);
}

std::vector<std::vector<data::SftExample>> Trainer::take_step_examples(int64_t& tokens, int64_t& targets) {
  // Every rank reads the same examples: the step's batch_size x grad_accum x dp
  // of them, this rank's micro-batches being its slices. So each rank knows the
  // step's target count.
  const int64_t accum = config_.train.grad_accum, rows = config_.data.batch_size;
  std::vector<std::vector<data::SftExample>> micro_batches(static_cast<size_t>(accum));
  for (auto& mine : micro_batches) {
    for (int64_t rank = 0; rank < dp_size_; ++rank) {
      for (int64_t row = 0; row < rows; ++row) {
        std::optional<data::SftExample> example = sft_stream_->next();
        if (!example) throw ConfigError(fmt::format("data.source '{}' gave no example", config_.data.source));
        targets += example->targets();
        tokens += static_cast<int64_t>(example->input_ids.size() + example->rejected_ids.size());
        if (rank == dp_->rank()) mine.push_back(std::move(*example));
      }
    }
  }
  return micro_batches;
}

at::Tensor Trainer::sft_forward_backward(int64_t& tokens) {
  // Each micro-batch's loss is its cross-entropy sum over the step's target
  // count (the per-token mean over the global batch, as transformers'
  // num_items_in_batch), times dp, which the gradient average over dp undoes.
  auto& model = *boosted_.model;
  auto& optimizer = *boosted_.optimizer;
  const int64_t accum = config_.train.grad_accum;
  int64_t targets = 0;
  const auto micro_batches = waiting_for_data([&] { return take_step_examples(tokens, targets); });
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device_);
  if (pipeline_) {
    // The step's micro-batches are one pipeline batch whose microbatches they
    // are (microbatch_size = data.batch_size), padded to a common length; each
    // microbatch's share is its cross-entropy sum over the same target count.
    std::vector<SftBatch> batches;
    for (const auto& examples : micro_batches) {
      batches.push_back(config_.data.packing ? pack_batch(examples, config_.data.seq_len, pad_id_)
                                             : pad_batch(examples, pad_id_));
    }
    const SftBatch whole = concat_batches(batches, pad_id_);
    const booster::PipelineBatch pipeline_batch{.input_ids = whole.input_ids.to(device_),
                                                .labels = whole.labels.to(device_),
                                                .layout = whole.layout.to(device_)};
    const double dp = static_cast<double>(dp_size_);
    auto out = booster_->execute_pipeline(
        [&] { return pipeline_batch; }, model,
        [&](const at::Tensor& logits, const booster::PipelineBatch& microbatch, int64_t) {
          return model.loss(logits, microbatch.labels, targets) * dp;
        },
        optimizer);
    return out.loss.detach().to(at::kDouble);
  }
  auto step_loss = at::zeros({}, f64);
  for (int64_t micro = 0; micro < accum; ++micro) {
    const auto& examples = micro_batches[static_cast<size_t>(micro)];
    const SftBatch batch = config_.data.packing ? pack_batch(examples, config_.data.seq_len, pad_id_)
                                                : pad_batch(examples, pad_id_);
    std::optional<booster::Booster::NoSyncGuard> no_sync;
    if (micro + 1 < accum) no_sync.emplace(model);
    auto loss = model.forward_loss(batch.input_ids.to(device_), batch.labels.to(device_), targets,
                                   batch.layout.to(device_)) *
                static_cast<double>(dp_size_);
    booster_->backward(loss, optimizer);
    step_loss += loss.detach().to(at::kDouble);
  }
  return step_loss;
}

void Trainer::build_reference_model(const models::ModelConfig& model_config) {
  const auto dtype = scalar_type_of(parse_precision(precision_, "precision"));
  const auto device = device_;
  reference_model_ = config_.model.pretrained.empty()
                         ? models::create_model(model_config, {.seed = config_.model.init_seed, .dtype = dtype, .device = device})
                         : models::load_pretrained(config_.model.pretrained, {.dtype = dtype, .device = device});
  reference_model_->eval();
  for (auto& p : reference_model_->parameters()) p.set_requires_grad(false);
}

at::Tensor Trainer::policy_logps(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& example_ids,
                                 int64_t examples) {
  // Ulysses (all_to_all) leaves the policy's logits sharded along the
  // sequence: each rank sums its shard's targets, then the sp group adds.
  const auto* hybrid = dynamic_cast<const booster::HybridParallelModel*>(boosted_.model.get());
  if (hybrid != nullptr && hybrid->sequence_shard_group() != nullptr) {
    return parallel::sequence::sequence_parallel_example_logps(logits, labels, example_ids, examples,
                                                               *hybrid->sequence_shard_group(),
                                                               hybrid->sequence_shard_layout());
  }
  return example_logps(logits, labels, example_ids, examples);
}

at::Tensor Trainer::dpo_forward_backward(int64_t& tokens) {
  // Each micro-batch: its pairs' chosen rows then rejected rows, padded, in
  // one forward of the policy and one of the reference; the loss is the mean
  // over the pairs (TRL's), divided by grad_accum; dp ranks hold equal pair
  // counts, so the gradient average over dp gives the global mean.
  auto& model = *boosted_.model;
  auto& optimizer = *boosted_.optimizer;
  const int64_t accum = config_.train.grad_accum;
  int64_t targets = 0;
  const auto micro_batches = waiting_for_data([&] { return take_step_examples(tokens, targets); });
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device_);
  auto step_loss = at::zeros({}, f64);
  if (!dpo_metrics_since_log_.defined()) dpo_metrics_since_log_ = at::zeros({4}, f64);
  if (pipeline_) return dpo_pipeline_step(micro_batches);
  for (int64_t micro = 0; micro < accum; ++micro) {
    const auto& pairs = micro_batches[static_cast<size_t>(micro)];
    std::vector<data::SftExample> rows;
    for (const auto& pair : pairs) rows.push_back({.input_ids = pair.input_ids, .trained = pair.trained});
    for (const auto& pair : pairs)
      rows.push_back({.input_ids = pair.rejected_ids, .trained = pair.rejected_trained});
    // Padded (a row each) or packed (several sequences a row, attention kept
    // inside each): log-probs are summed per sequence either way.
    const SftBatch batch = config_.data.packing ? pack_batch(rows, config_.data.seq_len, pad_id_)
                                                : pad_batch(rows, pad_id_);
    const auto ids = batch.input_ids.to(device_);
    const auto labels = batch.labels.to(device_);
    const auto layout = batch.layout.to(device_);
    const auto sequence = batch.example_ids.to(device_);
    const auto sequences = static_cast<int64_t>(rows.size());
    const auto counts = example_target_counts(labels, sequence, sequences);  // completion tokens per sequence
    at::Tensor reference;
    {
      at::NoGradGuard no_grad;
      if (reference_model_) {
        reference = example_logps(reference_model_->forward(ids, layout), labels, sequence, sequences);
      } else {
        lora::SnapshotAdapters initial_policy(model.unwrap());
        reference = policy_logps(model.forward(ids, layout), labels, sequence, sequences);
      }
    }
    std::optional<booster::Booster::NoSyncGuard> no_sync;
    if (micro + 1 < accum) no_sync.emplace(model);
    const auto policy = policy_logps(model.forward(ids, layout), labels, sequence, sequences);
    const auto n = static_cast<int64_t>(pairs.size());
    const DpoLoss dpo = dpo_loss(policy.slice(0, 0, n), policy.slice(0, n), reference.slice(0, 0, n),
                                 reference.slice(0, n), counts.slice(0, 0, n), counts.slice(0, n), config_.dpo);
    auto loss = dpo.loss / static_cast<double>(accum);
    booster_->backward(loss, optimizer);
    step_loss += loss.detach().to(at::kDouble);
    const auto margins = dpo.chosen_rewards - dpo.rejected_rewards;
    dpo_metrics_since_log_ += at::stack({dpo.chosen_rewards.mean(), dpo.rejected_rewards.mean(),
                                         margins.gt(0).to(at::kFloat).mean(), margins.mean()})
                                  .to(at::kDouble) /
                              static_cast<double>(accum);
  }
  return step_loss;
}

void Trainer::report_fp8_wire_bytes(const cluster::Fp8WireBytes& at_start, TrainResult& result) const {
  const cluster::Fp8WireBytes now = cluster::fp8_wire_bytes_sent();
  result.fp8_wire_bytes_per_step = now.fp8 - at_start.fp8;
  result.plain_wire_bytes_per_step = now.plain - at_start.plain;
  if (result.fp8_wire_bytes_per_step == 0) return;
  // Rank 0's figures: the dp ranks send the same amounts.
  constexpr double kMiB = 1024.0 * 1024.0;
  const double fp8_mib = static_cast<double>(result.fp8_wire_bytes_per_step) / kMiB;
  const double plain_mib = static_cast<double>(result.plain_wire_bytes_per_step) / kMiB;
  log.info(fmt::format("fp8 communication: {:.2f} MiB on the wire a step against {:.2f} MiB in the tensors' own "
                       "dtype ({:.3f}x)",
                       fp8_mib, plain_mib, plain_mib > 0 ? fp8_mib / plain_mib : 0.0));
}

void Trainer::update_router_biases() {
  auto* deepseek = dynamic_cast<models::DeepseekForCausalLM*>(&boosted_.model->unwrap());
  if (deepseek == nullptr) return;
  const models::DeepseekConfig& c = deepseek->deepseek_config();
  if (!c.is_v3() || c.router_bias_update_speed == 0.0) return;
  const std::vector<models::DeepseekMoe*> blocks = deepseek->moe_blocks();  // this pipeline stage's
  if (blocks.empty()) return;
  std::vector<at::Tensor> loads;
  for (const models::DeepseekMoe* block : blocks) loads.push_back(block->expert_load());
  at::Tensor load = at::stack(loads);  // (blocks, experts) fp32
  if (dp_size_ > 1) dp_->all_reduce(load).wait();
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i]->update_bias(c.router_bias_update_speed, load[i]);
}

at::Tensor Trainer::dpo_pipeline_step(const std::vector<std::vector<data::SftExample>>& micro_batches) {
  // Rows pair by pair (chosen, rejected, chosen, ...), the micro-batches one
  // under another, padded to the step's longest; each pipeline microbatch
  // holds whole pairs (an even row count, checked by the config). The
  // reference log-probs come first, from the whole reference model every
  // rank holds, and reach each microbatch's criterion as a row tensor; a
  // microbatch's loss is its pairs' share of the mean over the step's pairs.
  auto& model = *boosted_.model;
  if (!reference_model_) throw ConfigError("dpo under pipeline parallelism needs its own reference model (no LoRA)");
  std::vector<data::SftExample> rows;
  for (const auto& pairs : micro_batches) {
    for (const auto& pair : pairs) {
      rows.push_back({.input_ids = pair.input_ids, .trained = pair.trained});
      rows.push_back({.input_ids = pair.rejected_ids, .trained = pair.rejected_trained});
    }
  }
  const SftBatch batch = pad_batch(rows, pad_id_);
  booster::PipelineBatch pipeline_batch{
      .input_ids = batch.input_ids.to(device_), .labels = batch.labels.to(device_), .layout = batch.layout.to(device_)};
  at::Tensor reference;
  {
    at::NoGradGuard no_grad;
    reference = sequence_logps(reference_model_->forward(pipeline_batch.input_ids, pipeline_batch.layout),
                               pipeline_batch.labels);
  }
  const auto counts = pipeline_batch.labels.slice(1, 1).ne(-100).sum(1).to(at::kFloat);  // completion tokens per row
  pipeline_batch.row_tensors = {reference, counts};
  const double pairs_total = static_cast<double>(rows.size() / 2);
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device_);
  auto metric_sums = at::zeros({4}, f64);  // chosen rewards, rejected rewards, margins > 0, margins (sums over pairs)
  auto criterion = [&](const at::Tensor& logits, const booster::PipelineBatch& mb, int64_t) {
    const auto policy = sequence_logps(logits, mb.labels).view({-1, 2});
    const auto ref = mb.row_tensors[0].view({-1, 2}), count = mb.row_tensors[1].view({-1, 2});
    const DpoLoss dpo = dpo_loss(policy.select(1, 0), policy.select(1, 1), ref.select(1, 0), ref.select(1, 1),
                                 count.select(1, 0), count.select(1, 1), config_.dpo);
    const auto margins = dpo.chosen_rewards - dpo.rejected_rewards;
    metric_sums += at::stack({dpo.chosen_rewards.sum(), dpo.rejected_rewards.sum(),
                              margins.gt(0).to(at::kFloat).sum(), margins.sum()})
                       .to(at::kDouble);
    return dpo.loss * (static_cast<double>(policy.size(0)) / pairs_total);
  };
  auto out = booster_->execute_pipeline([&] { return pipeline_batch; }, model, criterion, *boosted_.optimizer);
  // The last stage computed the metrics: every stage takes them (rank 0 logs).
  if (auto hybrid = std::dynamic_pointer_cast<booster::HybridParallelPlugin>(plugin_); hybrid && hybrid->pp_group()) {
    hybrid->pp_group()->all_reduce(metric_sums).wait();
  }
  dpo_metrics_since_log_ += metric_sums / pairs_total;
  return out.loss.detach().to(at::kDouble);
}

TrainResult Trainer::run() {
  StopSignalScope signals;
  build();
  TrainResult result;
  result.first_step = state_.step;
  auto& model = *boosted_.model;
  auto& optimizer = *boosted_.optimizer;
  auto& scheduler = *boosted_.lr_scheduler;
  data::DataLoader* loader = boosted_.dataloader.get();  // null for sft and dpo
  const int64_t accum = config_.train.grad_accum;
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device_);
  // Summed on the device between log points, so a step needs no host sync.
  auto loss_since_log = at::zeros({}, f64);
  int64_t steps_since_log = 0;
  int64_t tokens_since_log = 0;
  auto last_log_time = std::chrono::steady_clock::now();
  int64_t last_saved = -1;
  std::optional<amp::GraphedTrainStep> graphed = make_graphed_step();
  nonfinite_run_ = at::zeros({}, f64);
  nonfinite_longest_ = at::zeros({}, f64);

  // SFT runs its own pipeline batches (sft_forward_backward).
  const bool pretrain_pipeline = pipeline_ && !reads_records();
  const cluster::Fp8WireBytes wire_at_start = cluster::fp8_wire_bytes_sent();
  while (state_.step < config_.train.steps) {
    at::Tensor step_loss;  // this step's loss (double, on the device)
    int64_t step_tokens = reads_records() ? 0 : global_batch_tokens();
    if (graphed) {
      // The whole step replays from one graph (optimizer step and zeroing included).
      step_loss = graphed->step(waiting_for_data([&] { return loader->next(); })).to(at::kDouble);
    } else if (pretrain_pipeline) {
      // The grad_accum loader batches as one pipeline batch; its loss is the
      // mean over microbatches, as the accumulated loss below.
      std::vector<at::Tensor> batches;
      for (int64_t micro = 0; micro < accum; ++micro)
        batches.push_back(waiting_for_data([&] { return loader->next(); }).to(device_, /*non_blocking=*/true));
      const auto ids = at::cat(batches);
      auto out = booster_->execute_pipeline([&] { return booster::PipelineBatch{.input_ids = ids}; }, model, {},
                                            optimizer);
      step_loss = out.loss.detach().to(at::kDouble);
    } else if (dpo()) {
      step_loss = dpo_forward_backward(step_tokens);
      loss_since_log += step_loss;
    } else if (reads_records()) {
      step_loss = sft_forward_backward(step_tokens);
      loss_since_log += step_loss;
    } else {
      step_loss = at::zeros({}, f64);
      for (int64_t micro = 0; micro < accum; ++micro) {
        auto ids = waiting_for_data([&] { return loader->next(); }).to(device_, /*non_blocking=*/true);
        std::optional<booster::Booster::NoSyncGuard> no_sync;
        if (micro + 1 < accum) no_sync.emplace(model);
        // The wrapper's loss: tensor parallelism computes it on vocab-sharded
        // logits, DDP and ZeRO with the head fused into the loss.
        auto loss = model.forward_loss(ids, ids) / static_cast<double>(accum);
        booster_->backward(loss, optimizer);
        const auto detached = loss.detach().to(at::kDouble);
        step_loss += detached;
        loss_since_log += detached;  // micro-batch by micro-batch, as the logged loss always was
      }
    }
    if (graphed || pretrain_pipeline) loss_since_log += step_loss;
    if (!graphed) {
      optimizer.step();
      optimizer.zero_grad();
      update_router_biases();
    }
    {
      // run = (run + 1) * bad: counts consecutive bad steps, on the device.
      auto bad = at::logical_not(at::isfinite(step_loss)).to(at::kDouble);
      if (nonfinite_gradients(optimizer, graphed.has_value())) bad.fill_(1.0);
      nonfinite_run_.add_(1.0).mul_(bad);
      nonfinite_longest_ = at::maximum(nonfinite_longest_, nonfinite_run_);
    }
    if (state_.step == result.first_step) report_fp8_wire_bytes(wire_at_start, result);
    scheduler.step();
    ++state_.step;
    ++steps_since_log;
    state_.tokens_seen += step_tokens;
    tokens_since_log += step_tokens;

    const bool last = state_.step == config_.train.steps;
    if (state_.step % config_.train.log_every == 0 || last) {
      // One all-reduce carries the loss, whether any rank was asked to stop,
      // and whether any rank saw max_nonfinite_steps non-finite steps in a row.
      auto packed = at::stack({loss_since_log, at::full({}, stop_requested.load() ? 1.0 : 0.0, f64)});
      packed[0] = packed[0] / static_cast<double>(dp_size_);
      if (dpo_metrics_since_log_.defined()) packed = at::cat({packed, dpo_metrics_since_log_ / static_cast<double>(dp_size_)});
      dp_->all_reduce(packed).wait();
      // Over the world, not dp: a pipeline's first stages never see the loss.
      auto diverged = at::ge(nonfinite_longest_, static_cast<double>(config_.train.max_nonfinite_steps)).to(at::kDouble);
      world_->all_reduce(diverged).wait();
      auto host = packed.cpu();
      if (diverged.item<double>() > 0) {
        publish_pending_checkpoint();  // saved before the bad steps, when it was checked finite
        reporter_->finish();
        const auto good = dirs_.latest();
        throw DivergenceError(fmt::format(
            "training diverged: at least {} consecutive steps up to step {} had a non-finite loss or gradients "
            "(train.max_nonfinite_steps = {}); no checkpoint of them was published, {}. Lower optimizer.lr, set "
            "booster.max_norm, or resume from an earlier checkpoint",
            config_.train.max_nonfinite_steps, state_.step, config_.train.max_nonfinite_steps,
            good ? "the last good one is " + *good : std::string("and there is no earlier one")));
      }
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - last_log_time).count();
      StepRecord record{.step = state_.step,
                        .loss = host[0].item<double>() / static_cast<double>(steps_since_log),
                        .lr = scheduler.lr(),
                        .tokens_per_s = static_cast<double>(tokens_since_log) / seconds,
                        .grad_norm = optimizer.last_grad_norm(),
                        .step_time_s = seconds / static_cast<double>(steps_since_log),
                        .data_wait_s = data_wait_since_log_ / static_cast<double>(steps_since_log),
                        .peak_host_mib = static_cast<double>(metrics::host_peak_rss_bytes()) / (1 << 20)};
      if (precision_ == "fp16") record.loss_scale = optimizer.loss_scale();
      if (const auto memory = metrics::device_memory())
        record.peak_device_mib = static_cast<double>(memory->max_allocated_bytes) / (1 << 20);
      data_wait_since_log_ = 0.0;
      if (dpo_metrics_since_log_.defined()) {
        const double steps = static_cast<double>(steps_since_log);
        record.metrics = {{"rewards/chosen", host[2].item<double>() / steps},
                          {"rewards/rejected", host[3].item<double>() / steps},
                          {"rewards/accuracies", host[4].item<double>() / steps},
                          {"rewards/margins", host[5].item<double>() / steps}};
        dpo_metrics_since_log_.zero_();
      }
      state_.last_loss = record.loss;
      result.steps.push_back(record);
      const double mfu = device_.is_cuda() ? record.tokens_per_s * flops_per_token_ /
                                                 (config_.train.peak_tflops * 1e12 * static_cast<double>(world_->size()))
                                           : std::nan("");
      reporter_->on_step(record, state_.tokens_seen, mfu);
      loss_since_log.zero_();
      steps_since_log = 0;
      tokens_since_log = 0;
      last_log_time = now;
      if (host[1].item<double>() > 0) {
        log.warning(fmt::format("stop requested: saving a checkpoint at step {} and exiting; rerun with --resume "
                                "to continue",
                                state_.step));
        const bool finite = state_is_finite();
        if (finite && config_.train.save) {
          save_checkpoint(state_.step);
        } else {
          log.warning(fmt::format("step {}: the loss or the parameters are not finite; not saving a checkpoint",
                                  state_.step));
        }
        publish_pending_checkpoint();
        result.interrupted = true;
        if (finite && config_.train.save) result.final_checkpoint = dirs_.step_dir(state_.step);
        result.final_step = state_.step;
        reporter_->finish();
        return result;
      }
    }
    if ((config_.train.eval_every > 0 && state_.step % config_.train.eval_every == 0) || last) {
      const double eval_loss = evaluate();
      if (!std::isnan(eval_loss)) {
        result.eval_losses.emplace_back(state_.step, eval_loss);
        reporter_->on_eval(state_.step, eval_loss);
      }
      last_log_time = std::chrono::steady_clock::now();  // eval time is not training throughput
    }
    if (config_.train.save && ((config_.train.save_every > 0 && state_.step % config_.train.save_every == 0) || last)) {
      // A NaN checkpoint published as `latest` would also let keep_last prune the good ones.
      if (state_is_finite()) {
        save_checkpoint(state_.step);
        last_saved = state_.step;
      } else if (last) {
        publish_pending_checkpoint();
        reporter_->finish();
        const auto good = dirs_.latest();
        throw DivergenceError(fmt::format("training ended at step {} with a non-finite loss or parameters; no "
                                          "checkpoint of it was published, {}",
                                          state_.step, good ? "the last good one is " + *good : "there is no earlier one"));
      } else {
        log.warning(fmt::format("step {}: the loss or the parameters are not finite; not saving a checkpoint", state_.step));
      }
      last_log_time = std::chrono::steady_clock::now();
    }
  }
  publish_pending_checkpoint();
  if (sft_stream_ && (sft_stream_->dropped() > 0 || sft_stream_->source().skipped() > 0)) {
    const std::string skipped = sft_stream_->source().skip_summary();
    log.warning(fmt::format("sft: {} example(s) dropped with no trained token (prompt longer than data.max_length?){}",
                            sft_stream_->dropped(), skipped.empty() ? "" : "; " + skipped));
  }
  result.final_step = state_.step;
  if (last_saved >= 0) result.final_checkpoint = dirs_.step_dir(last_saved);
  reporter_->finish();
  // Sampling runs the plain model on rank 0 alone: a model split over ranks
  // (tensor or pipeline parallel, Gemini's chunks) needs them all for a
  // forward, so its sample is left to `colossus generate`.
  if (world_->rank() == 0 && !config_.train.sample_prompt.empty() && config_.train.sample_tokens > 0) {
    if (!plugin_->holds_whole_model()) {
      log.info(fmt::format("no sample with plugin {} (the model is split over ranks): run `colossus generate` on "
                           "the saved checkpoint",
                           plugin_->name()));
    } else {
      print_sample();
    }
  }
  return result;
}

}  // namespace

TrainResult train(const TrainConfig& config, const TrainOptions& options) {
  config.validate();
  Trainer trainer(config, options);
  return trainer.run();
}

}  // namespace colossus::apps
