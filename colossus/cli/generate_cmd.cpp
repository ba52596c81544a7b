// `colossus generate PATH --prompt TEXT`: loads a Hugging Face model directory
// or a training checkpoint into an InferenceEngine and prints each prompt
// followed by its continuation as the tokens arrive; `--chat` keeps a
// conversation read from stdin, through the model's chat template.
#include "colossus/cli/commands.h"
#include "colossus/cli/inference_common.h"
#include "colossus/core/errors.h"
#include "colossus/inference/engine/engine.h"
#include "colossus/inference/model_dir.h"
#include "colossus/inference/serving/chat_prompt.h"
#include "colossus/models/pretrained.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

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
  std::string lora;  // --lora: a PEFT adapter to merge in
  std::string dtype = "fp32";
  std::string device = "cpu";
  bool chat = false;
  std::string system;
  int64_t block_size = 16;
  std::string ids_out;  // JSON lines of prompt and generated token ids, for scripts
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
the same text; prompt i uses seed + i). --greedy (or --temperature 0) takes the
most likely token. Generation runs on the InferenceEngine (paged KV cache).
A --stop string ends the sample and is not printed.

--chat: an interactive conversation. Each line read from stdin is a user
message; the reply streams to stdout. The conversation goes through the model
directory's chat template (chat_template.jinja or tokenizer_config.json's
chat_template), or, without one, plain "role: content" lines. The oldest turns
are dropped when it outgrows the model's context. /reset forgets the
conversation; /exit or end of input ends the session.

Examples:
  colossus generate runs/demo --prompt "Once upon a time" --max_new_tokens 200
  colossus generate ./gpt2 --prompt "Hello" --greedy --dtype bf16 --device cuda
  colossus generate ./llama-chat --chat --system "You are terse." --max_new_tokens 256)";

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

// One engine request to completion, its text streamed to stdout. Returns the text.
struct Continuation {
  std::string text;
  std::vector<int64_t> ids;
};

Continuation stream_request(inference::InferenceEngine& engine, std::vector<int64_t> ids,
                            const inference::RequestOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t id = engine.add_request(std::move(ids), options);
  Continuation out;
  int64_t new_tokens = 0;
  while (engine.has_unfinished()) {
    for (const inference::RequestOutput& step : engine.step()) {
      if (step.request_id != id) continue;
      new_tokens = step.generated_tokens;
      out.text += step.new_text;
      out.ids.insert(out.ids.end(), step.new_tokens.begin(), step.new_tokens.end());
      print(step.new_text);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "[%lld tokens in %.2f s, %.1f tok/s]\n", static_cast<long long>(new_tokens), seconds,
               seconds > 0 ? static_cast<double>(new_tokens) / seconds : 0.0);
  return out;
}

inference::RequestOptions request_options(const GenerateArgs& args, int64_t max_new_tokens, uint64_t seed) {
  return {.max_new_tokens = max_new_tokens,
          .sampling = inference::SamplingParams{.do_sample = !args.greedy,
                                                .temperature = args.temperature,
                                                .top_k = args.top_k,
                                                .top_p = args.top_p,
                                                .repetition_penalty = args.repetition_penalty,
                                                .seed = seed},
          .stop = args.stop};
}

// --chat: user lines from stdin, replies streamed, the conversation kept.
int run_chat(const GenerateArgs& args, inference::InferenceEngine& engine, const data::Tokenizer& tokenizer,
             const std::string& model_dir, int64_t context) {
  const auto chat = inference::serving::ChatPrompt::from_model_dir(model_dir);
  const bool interactive = isatty(STDIN_FILENO);
  std::fprintf(stderr, "chat (%s); /reset forgets the conversation, /exit or end of input ends it\n",
               chat.has_template() ? "the model's chat template" : "no chat template: plain role: content lines");
  auto fresh = [&] {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!args.system.empty()) messages.push_back({{"role", "system"}, {"content", args.system}});
    return messages;
  };
  nlohmann::ordered_json messages = fresh();
  const size_t first_turn = messages.size();
  std::string line;
  for (uint64_t turn = 0;; ++turn) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      messages = fresh();
      std::fputs("[conversation reset]\n", stderr);
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    std::vector<int64_t> ids;
    for (;;) {
      const std::vector<int32_t> ids32 = tokenizer.encode(chat.render(messages), chat.add_special_tokens());
      ids.assign(ids32.begin(), ids32.end());
      // Keep room for at least a short reply; drop the oldest exchange otherwise.
      const auto room = context - static_cast<int64_t>(ids.size());
      if (room >= std::min<int64_t>(args.max_new_tokens, 16) && static_cast<int64_t>(ids.size()) <= engine.config().max_input_len) break;
      if (messages.size() <= first_turn + 1) {
        throw ConfigError(fmt::format("the message is {} tokens: too long for the model's context of {} positions",
                                      ids.size(), context));
      }
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first_turn),
                     messages.begin() + static_cast<std::ptrdiff_t>(std::min(messages.size() - 1, first_turn + 2)));
    }
    const int64_t max_new = std::min(args.max_new_tokens, context - static_cast<int64_t>(ids.size()));
    const std::string reply =
        stream_request(engine, std::move(ids), request_options(args, max_new, args.seed + turn)).text;
    print("\n");
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

int run_generate(const GenerateArgs& args) {
  request_options(args, 1, args.seed).sampling->validate();  // before the (slow) load
  const c10::Device device = parse_device(args.device);
  const std::string model_dir = inference::resolve_model_dir(args.path);
  std::shared_ptr<const data::Tokenizer> tokenizer = open_tokenizer(args.tokenizer, model_dir);

  std::shared_ptr<models::CausalLM> model =
      load_inference_model(model_dir, args.lora, {.dtype = parse_dtype(args.dtype), .device = device});

  const int64_t context = context_length(*model);
  std::vector<std::vector<int64_t>> prompt_ids;
  const std::vector<std::string> prompts = args.prompts.empty() ? std::vector<std::string>{""} : args.prompts;
  int64_t longest = 1;
  if (!args.chat) {
    for (const auto& prompt : prompts) {
      prompt_ids.push_back(encode_prompt(*tokenizer, prompt));
      const auto length = static_cast<int64_t>(prompt_ids.back().size());
      if (length >= context) {
        throw ConfigError(fmt::format("the prompt '{:.40}...' is {} tokens, and the model's context is {} positions, so "
                                      "no token could follow it; shorten it to at most {} tokens",
                                      prompt, length, context, context - 1));
      }
      longest = std::max(longest, length);
    }
  }
  // One request at a time: a pool for one sequence of the longest length.
  const int64_t max_input_len = args.chat ? std::max<int64_t>(context - 1, 1) : longest;
  // No continuation runs past the context, so neither does the pool sized from this.
  const int64_t max_output_len = std::clamp<int64_t>(args.max_new_tokens, 1, std::max<int64_t>(context - longest, 1));
  const int64_t most_tokens = args.chat ? context : longest + max_output_len;
  inference::InferenceEngine engine(model, tokenizer,
                                    {.max_batch_size = 1,
                                     .max_input_len = max_input_len,
                                     .max_output_len = max_output_len,
                                     .dtype = args.dtype,
                                     .block_size = args.block_size,
                                     .num_blocks = (most_tokens + args.block_size - 1) / args.block_size + 2});
  if (args.chat) {
    if (!args.ids_out.empty()) throw ConfigError("--ids_out writes the ids of --prompt continuations; drop it with --chat");
    return run_chat(args, engine, *tokenizer, model_dir, context);
  }

  std::ofstream ids_out;
  if (!args.ids_out.empty()) {
    ids_out.open(args.ids_out);
    if (!ids_out) throw ConfigError(fmt::format("--ids_out {}: cannot open it for writing", args.ids_out));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i > 0) print("\n");
    print(prompts[i]);
    // GPT-2 has no positions past n_positions: the continuation stops there.
    const int64_t max_new = std::min(args.max_new_tokens, context - static_cast<int64_t>(prompt_ids[i].size()));
    Continuation continuation;
    if (max_new > 0) {
      continuation = stream_request(engine, prompt_ids[i], request_options(args, max_new, args.seed + i));
    }
    print("\n");
    if (ids_out.is_open()) {
      ids_out << nlohmann::json{{"prompt", prompts[i]}, {"prompt_ids", prompt_ids[i]}, {"ids", continuation.ids}}.dump()
              << "\n";
    }
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
  sub->add_option("--lora", args->lora,
                  "A PEFT LoRA adapter directory to merge into the model (a LoRA training checkpoint's own adapter/ "
                  "is found by itself)");
  sub->add_option("--tokenizer", args->tokenizer,
                  "Tokenizer directory or file (default: the model directory); 'byte' = the built-in byte tokenizer");
  sub->add_option("--dtype", args->dtype, "Weights and compute dtype")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--device", args->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--block_size", args->block_size, "Tokens per KV cache block (1..1024)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--ids_out", args->ids_out,
                  "Also write one JSON line per prompt to this file: prompt, prompt_ids and the generated ids");
  sub->add_flag("--chat", args->chat, "Interactive chat: user messages from stdin, replies streamed (see below)");
  sub->add_option("--system", args->system, "With --chat: a system message that starts the conversation");
  sub->footer(kFooter);
  return {sub, [args] { return run_generate(*args); }};
}

}  // namespace colossus::cli
