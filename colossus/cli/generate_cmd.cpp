// `colossus generate PATH --prompt TEXT`: loads a Hugging Face model directory
// or a training checkpoint, and prints each prompt followed by its sampled
// continuation as the tokens arrive (no KV cache yet: see inference/generate.h).
#include "colossus/cli/commands.h"
#include "colossus/core/accelerator.h"
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/data/tokenizer.h"
#include "colossus/inference/generate.h"
#include "colossus/inference/model_dir.h"
#include "colossus/inference/text_stream.h"
#include "colossus/models/pretrained.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

namespace colossus::cli {

namespace {

struct GenerateArgs {
  std::string path;
  std::vector<std::string> prompts;
  int64_t max_new_tokens = 100;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double repetition_penalty = 1.0;
  bool greedy = false;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::string tokenizer;
  std::string dtype = "fp32";
  std::string device = "cpu";
};

constexpr const char* kFooter = R"(PATH is one of:
  a Hugging Face model directory   config.json + *.safetensors (+ tokenizer files)
  a checkpoint step directory      RUN/checkpoints/step-00000100 (holds model/)
  a checkpoints or run directory   the step named by its `latest` file (or checkpoints/latest)

The tokenizer comes from --tokenizer, else from the model directory's
tokenizer.json, vocab.json + merges.txt or tokenizer.model.
The prompt is encoded with the tokenizer's special tokens (e.g. a leading BOS);
without --prompt one sample starts from the BOS token alone.

Sampling follows Hugging Face generate(): repetition penalty, then temperature,
top-k, top-p, then a draw from a generator seeded by --seed (the same seed gives
the same text). --greedy (or --temperature 0) takes the most likely token.
Each step recomputes the whole context (no KV cache yet).

Examples:
  colossus generate runs/demo --prompt "Once upon a time" --max_new_tokens 200
  colossus generate ./gpt2 --prompt "Hello" --greedy --dtype bf16 --device cuda)";

c10::ScalarType parse_dtype(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> dtypes{
      {"fp32", c10::kFloat}, {"bf16", c10::kBFloat16}, {"fp16", c10::kHalf}};
  return dtypes.at(name);  // CLI11 has checked the name
}

c10::Device parse_device(const std::string& name) {
  if (name == "cpu") return c10::kCPU;
  if (name.rfind("cuda", 0) != 0) {
    throw ConfigError(fmt::format("--device '{}' is not a device; expected cpu, cuda or cuda:N", name));
  }
  const auto accelerator = probe_accelerator();
  if (!accelerator) {
    throw ConfigError(
        fmt::format("--device {} needs a CUDA build of colossus; this one is CPU only (use --device cpu)", name));
  }
  if (accelerator->devices.empty()) {
    throw ConfigError(fmt::format("--device {}: no GPU is visible{}; use --device cpu", name,
                                  accelerator->error.empty() ? "" : " (" + accelerator->error + ")"));
  }
  return name == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(name);
}

bool has_tokenizer_files(const std::filesystem::path& dir) {
  for (const char* name : {"tokenizer.json", "vocab.json", "tokenizer.model"}) {
    if (std::filesystem::is_regular_file(dir / name)) return true;
  }
  return false;
}

std::unique_ptr<data::Tokenizer> open_tokenizer(const std::string& option, const std::string& model_dir) {
  if (option == "byte") return data::make_byte_tokenizer();
  if (!option.empty()) return data::load_tokenizer(option);
  if (has_tokenizer_files(model_dir)) return data::load_tokenizer(model_dir);
  throw ConfigError(
      fmt::format("no tokenizer in '{}' (looked for tokenizer.json, vocab.json + merges.txt, "
                  "tokenizer.model); pass --tokenizer DIR, or --tokenizer byte for the byte tokenizer",
                  model_dir));
}

std::vector<int64_t> encode_prompt(const data::Tokenizer& tokenizer, const std::string& text) {
  const std::vector<int32_t> ids32 = tokenizer.encode(text, /*add_special_tokens=*/true);
  std::vector<int64_t> ids(ids32.begin(), ids32.end());
  if (ids.empty()) {
    // GPT-2's tokenizer adds nothing to an empty prompt; start from its BOS.
    auto start = tokenizer.bos_id() ? tokenizer.bos_id() : tokenizer.eos_id();
    if (!start)
      throw ConfigError("the prompt is empty and the tokenizer has no bos/eos token to start from; give --prompt");
    ids.push_back(*start);
  }
  return ids;
}

void print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

int run_generate(const GenerateArgs& args) {
  inference::GenerateOptions options{
      .max_new_tokens = args.max_new_tokens,
      .sampling = {.do_sample = !args.greedy,
                   .temperature = args.temperature,
                   .top_k = args.top_k,
                   .top_p = args.top_p,
                   .repetition_penalty = args.repetition_penalty,
                   .seed = args.seed},
      .stop_strings = args.stop,
  };
  options.sampling.validate();  // before the (slow) load
  const c10::Device device = parse_device(args.device);
  const std::string model_dir = inference::resolve_model_dir(args.path);
  auto tokenizer = open_tokenizer(args.tokenizer, model_dir);

  const auto load_start = std::chrono::steady_clock::now();
  auto model = models::load_pretrained(model_dir, {.dtype = parse_dtype(args.dtype), .device = device});
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  std::fprintf(stderr, "loaded %s (%s, %lld layers, %s, %s) in %.1f s\n", model_dir.c_str(),
               models::model_type(model->config()).c_str(), static_cast<long long>(models::num_layers(model->config())),
               args.dtype.c_str(), device.str().c_str(), load_seconds);

  options.tokenizer = tokenizer.get();
  if (auto eos = tokenizer->eos_id()) options.eos_id = *eos;
  at::Generator generator = inference::make_cpu_generator(args.seed);
  const std::vector<std::string> prompts = args.prompts.empty() ? std::vector<std::string>{""} : args.prompts;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i > 0) print("\n");
    std::vector<int64_t> ids = encode_prompt(*tokenizer, prompts[i]);
    print(prompts[i]);
    inference::TextStream stream(*tokenizer);
    int64_t new_tokens = 0;
    options.on_token = [&](int64_t token) {
      ++new_tokens;
      print(stream.push(token));
    };
    const auto start = std::chrono::steady_clock::now();
    inference::generate(*model, std::move(ids), options, generator);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    print(stream.finish() + "\n");
    std::fprintf(stderr, "[%lld tokens in %.2f s, %.1f tok/s]\n", static_cast<long long>(new_tokens), seconds,
                 seconds > 0 ? static_cast<double>(new_tokens) / seconds : 0.0);
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Generate text from a model directory or a training checkpoint");
  auto args = std::make_shared<GenerateArgs>();
  sub->add_option("PATH", args->path, "Model directory, checkpoint step directory, or run/checkpoints directory")
      ->required();
  sub->add_option("--prompt", args->prompts, "Text to continue; repeat for several prompts (each sampled in turn)");
  sub->add_option("--max_new_tokens", args->max_new_tokens, "Most tokens to generate per prompt")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--temperature", args->temperature, "Divide the logits by this; 0 = greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--top_k", args->top_k, "Sample among the k most likely tokens; 0 = off")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--top_p", args->top_p, "Sample among the smallest set of tokens with probability >= p; 1 = off")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--repetition_penalty", args->repetition_penalty,
                  "Penalise tokens already in the text (HF's formula); > 1 discourages repeats, 1 = off")
      ->capture_default_str();
  sub->add_flag("--greedy", args->greedy, "Always take the most likely token (no sampling)");
  sub->add_option("--seed", args->seed, "Seed of the sampling generator")->capture_default_str();
  sub->add_option("--stop", args->stop, "Stop a sample once its text contains this string; repeatable");
  sub->add_option("--tokenizer", args->tokenizer,
                  "Tokenizer directory or file (default: the model directory); 'byte' = the built-in byte tokenizer");
  sub->add_option("--dtype", args->dtype, "Weights and compute dtype")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--device", args->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->footer(kFooter);
  return {sub, [args] { return run_generate(*args); }};
}

}  // namespace colossus::cli
