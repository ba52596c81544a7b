// The configuration of `colossus train`: one TOML file whose sections map one
// to one onto the option structs of the layers below (model config.json keys,
// DDPPluginOptions, BoosterOptions, the optimizer and scheduler options), with
// `--section.key=value` overrides from the command line. Unknown keys and
// wrong types are ConfigErrors naming the key and what would be valid.
#pragma once
#include "colossus/apps/trainer/dpo_options.h"
#include "colossus/lora/lora_config.h"
#include "colossus/booster/booster.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/gemini_plugin.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/booster/low_level_zero_plugin.h"
#include "colossus/moe/moe_hybrid_parallel_plugin.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace colossus::apps {

struct ModelSection {
  std::string preset = "gpt2-tiny";  // models::preset_names()
  std::string pretrained;            // a Hugging Face model directory; replaces the preset
  // config.json keys of the model (n_layer, hidden_size, rope_theta, ...), each
  // value as JSON text, applied over the preset or the pretrained config.
  std::map<std::string, std::string> config;
  uint64_t init_seed = 0;  // seeded HF initialisation (ignored with pretrained)
  // Activation checkpointing under every plugin: the first round(ratio x
  // blocks) blocks rerun their forward in backward (Colossal-AI's
  // gradient_checkpointing_ratio; dropout replays its RNG). 0: off.
  // hybrid_parallel takes its own plugin.gradient_checkpointing_ratio.
  double gradient_checkpointing_ratio = 0.0;
  // What a checkpointed block reruns: "full" (the whole block) or "mlp"
  // (only its MLP: attention's activations are kept; dense blocks only).
  std::string gradient_checkpointing_granularity = "full";
  // FP8 matmuls in the decoder blocks' linear layers (Colossal-AI's use_fp8;
  // models/fp8_linear.h): x and W in e4m3, gradients in fp8_grad_format;
  // fp8_scaling "tensorwise" or "rowwise" (the forward's scales); the first
  // and last blocks, embeddings and head stay in the model's dtype unless
  // fp8_keep_first_last is false.
  bool use_fp8 = false;
  std::string fp8_scaling = "tensorwise";
  std::string fp8_grad_format = "e5m2";
  bool fp8_keep_first_last = true;
  int64_t fp8_amax_history_len = 0;  // > 0: delayed scaling (tensorwise)
};

struct DataSection {
  // "builtin" (generated corpus, no download), a UTF-8 text file, a directory
  // of *.txt files, or a directory of token shards (*.tokens, from a previous
  // run's data/ or `tokenize_to_shards`; an eval/ subdirectory is the held-out split).
  // JSONL records (a .jsonl file, glob or folder of them) are refused: they are post-training data.
  std::string source = "builtin";
  // "byte", or a Hugging Face tokenizer directory or file; empty (the
  // default): model.pretrained's own tokenizer, or "byte" without one.
  std::string tokenizer = "";
  int64_t builtin_bytes = int64_t{4} << 20;
  int64_t seq_len = 128;
  int64_t batch_size = 8;  // sequences per rank per micro-batch
  double eval_fraction = 0.02;  // of the documents, held out for eval loss
  int prefetch = 4;
  bool shuffle = true;
  std::string cache_dir;  // where tokenized shards go; default OUTPUT_DIR/data
  // train.task = "sft": source is JSONL records (a file, folder or glob).
  std::string format = "auto";          // auto | chat | prompt_completion | text | preference
  std::string train_on = "auto";        // auto | assistant | completion | all (data/sft_examples.h)
  int64_t max_length = 0;               // tokens kept per example; 0: seq_len
  std::string truncation = "keep_start";  // keep_start | keep_end
  bool skip_bad_lines = false;          // count and skip a bad JSONL line instead of stopping
  bool packing = false;                 // several examples per seq_len row (else one a row, padded to the longest)
  int tokenize_threads = 2;             // SFT tokenizing threads per rank
};

struct OptimizerSection {
  std::string name = "adamw";  // adamw | adam | sgd | lamb | hybrid_adam
  double lr = 3e-4;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
  // GPT-style recipes exempt biases and norm weights (1-D tensors) from decay.
  bool decay_1d_params = false;
};

struct SchedulerSection {
  std::string name = "cosine";  // constant | linear | cosine
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // 0: train.steps
  double min_lr_ratio = 0.0;  // cosine floor as a fraction of lr
};

struct PluginSection {
  std::string name = "ddp";  // ddp | low_level_zero | gemini | hybrid_parallel | moe_hybrid_parallel
  booster::DDPPluginOptions ddp = {};
  // name = "low_level_zero": its precision and max_norm replace the booster's.
  booster::LowLevelZeroPluginOptions low_level_zero = {};
  // name = "gemini": ZeRO-3 chunks with offload; its precision and max_norm
  // replace the booster's (memory_probe is C++ only).
  booster::GeminiPluginOptions gemini = {};
  // name = "gemini": build the model on the meta device and let each rank
  // materialise only its chunk shards (from model.init_seed, or from
  // model.pretrained), so no rank allocates the whole model.
  bool lazy_init = false;
  // name = "hybrid_parallel": tensor x data parallel; its precision and
  // max_norm replace the booster's (custom_policy is C++ only).
  booster::HybridParallelPluginOptions hybrid_parallel = {};
  // name = "moe_hybrid_parallel": expert x data (x tensor x pipeline)
  // parallel for MoE models; its precision and max_norm replace the
  // booster's. The router losses and the capacity are the model's
  // (model.config: output_router_logits, router_aux_loss_coef,
  // router_z_loss_coef, capacity_factor).
  moe::MoeHybridParallelPluginOptions moe_hybrid_parallel = {};
};

// The plugin names [plugin] name takes.
const std::vector<std::string>& plugin_names();

struct TrainSection {
  // pretrain (token streams) | sft (JSONL records, trained tokens only) | dpo (preference records, [dpo])
  std::string task = "pretrain";
  int64_t steps = 1000;       // optimizer steps in all (a resumed run continues to this)
  int64_t grad_accum = 1;     // micro-batches per optimizer step
  uint64_t seed = 42;         // data order, dropout
  // Deterministic kernels only (torch.use_deterministic_algorithms, cuBLAS's
  // fixed workspace): a run repeats bit for bit on the same GPU and software;
  // an op without a deterministic kernel stops the run naming itself.
  bool deterministic = false;
  std::string output_dir = "runs/colossus";
  int64_t log_every = 10;     // JSONL/TensorBoard record and a progress line
  int64_t eval_every = 0;     // 0: only at the end
  int64_t eval_batches = 8;   // per rank
  int64_t save_every = 0;     // 0: only the final checkpoint
  // false: no checkpoint at all (a benchmark or a dry run; nothing to resume
  // from). A 7B run's optimizer state alone is ~90 GB of disk.
  bool save = true;
  int64_t keep_last = 2;      // older step checkpoints are removed; 0 keeps all
  // The run stops (DivergenceError) once this many consecutive steps had a
  // non-finite loss or gradients (steps the fp16 loss scaler skips do not
  // count). Checked at log points, so it stops at the first log point after.
  // A checkpoint with a non-finite loss or parameters is never published.
  int64_t max_nonfinite_steps = 3;
  bool async_save = false;
  // Capture the whole step (forward, backward, optimizer) in a CUDA graph
  // after 3 eager steps and replay it (amp::GraphedTrainStep): one GPU, bf16
  // without clipping, ddp plugin, grad_accum 1.
  bool cuda_graph = false;
  int64_t size_per_shard_mb = 1024;
  bool tensorboard = true;
  std::string backend = "auto";  // auto | nccl | mpi
  double peak_tflops = 989.0;    // per GPU, for MFU (H100/H200 dense bf16)
  // Text to continue with the trained model at the end (rank 0 prints it);
  // empty to skip.
  std::string sample_prompt;
  int64_t sample_tokens = 200;
  double sample_temperature = 0.6;  // top-k 20; 0 = greedy
};

// [lora]: LoRA adapters over the frozen base model, PEFT's LoraConfig names;
// r > 0 turns it on. Checkpoints then hold the adapters in PEFT's format in
// adapter/ beside model/.
struct LoraSection {
  int64_t r = 0;
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  std::string target_modules = "all-linear";  // "all-linear" or module names, comma-separated ("q_proj,v_proj")
  std::string modules_to_save;                // modules trained whole, comma-separated ("lm_head"); "": none
  std::string bias = "none";                  // biases that train: none, all, lora_only (PEFT's)
  bool use_rslora = false;
  // A PEFT adapter directory to continue training (PEFT's
  // from_pretrained(is_trainable=True)): its adapter_config.json sets the
  // options, so r and the rest stay unset.
  std::string adapter;
  // "nf4": QLoRA, the base's linear layers stored in 4-bit NF4 (double
  // quantised, as bitsandbytes) and dequantised in each forward; "": as loaded.
  std::string quantize;
  bool enabled() const { return r > 0 || !adapter.empty(); }
};

struct TrainConfig {
  ModelSection model;
  DataSection data;
  OptimizerSection optimizer;
  SchedulerSection lr_scheduler;
  PluginSection plugin;
  booster::BoosterOptions booster;
  TrainSection train;
  DpoOptions dpo;
  LoraSection lora;
  // The TOML text this config was read from, overrides applied (saved in the run directory).
  std::string toml_text;

  // Throws ConfigError naming the first bad value and a valid alternative.
  void validate() const;
};

// Parses TOML text; `overrides` are "section.key=value" (value in TOML syntax,
// bare words taken as strings), applied over the file. `origin` names the
// source in errors.
TrainConfig parse_train_config(const std::string& toml_text, const std::vector<std::string>& overrides = {},
                               const std::string& origin = "config");
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});

// [lora] as the adapters' options (target_modules split at commas).
lora::LoraConfig lora_config(const LoraSection& section);

}  // namespace colossus::apps
