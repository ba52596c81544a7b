// `colossus data prepare INPUT... --tokenizer PATH --output DIR`: a corpus
// tokenized into token shards for `colossus train` (data.source = DIR), as a
// stream on every core, resumable (colossus/data/prepare.h).
#include "colossus/cli/commands.h"
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/data/prepare.h"
#include "colossus/metrics/progress_bar.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace colossus::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string tokenizer;
  std::string output;
  std::string text_key = "text";
  bool per_line = false;
  int64_t shard_tokens = int64_t{1} << 26;
  int threads = 0;
};

int run_prepare(const PrepareArgs& args) {
  const auto tokenizer = args.tokenizer == "byte" ? data::make_byte_tokenizer() : data::load_tokenizer(args.tokenizer);
  const auto files = data::expand_prepare_inputs(args.inputs);
  int64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<int64_t>(std::filesystem::file_size(f));
  metrics::ProgressBar bar(total_bytes, "prepare", {.rate_unit = "tok", .show_memory = false});
  const auto start = std::chrono::steady_clock::now();
  int64_t last_tokens = 0;
  data::PrepareOptions options{.inputs = args.inputs,
                               .output_dir = args.output,
                               .text_key = args.text_key,
                               .per_line = args.per_line,
                               .shard_tokens = args.shard_tokens,
                               .threads = args.threads};
  options.progress = [&](int64_t documents, int64_t tokens, int64_t bytes) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bar.update(bytes, {{"docs", static_cast<double>(documents)},
                       {"tokens", static_cast<double>(tokens - last_tokens)},
                       {"MB/s", static_cast<double>(bytes) / 1e6 / std::max(seconds, 1e-9)}});
    last_tokens = tokens;
  };
  const auto result = data::prepare_token_shards(*tokenizer, options);
  bar.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.already_done) {
    std::fprintf(stderr, "%s is already complete: %lld documents, %lld tokens in %zu shards\n", args.output.c_str(),
                 static_cast<long long>(result.documents), static_cast<long long>(result.tokens), result.shards.size());
    return 0;
  }
  std::fprintf(stderr, "%s%lld documents, %lld tokens in %zu shards (%.1f MB read in %.1f s, %.0f tokens/s) in %s\n",
               result.resumed ? "resumed; " : "", static_cast<long long>(result.documents),
               static_cast<long long>(result.tokens), result.shards.size(), static_cast<double>(result.bytes) / 1e6,
               seconds, static_cast<double>(result.tokens) / std::max(seconds, 1e-9), args.output.c_str());
  return 0;
}

}  // namespace

Command add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Data preparation: tokenize a corpus into token shards");
  data->require_subcommand(1);
  auto args = std::make_shared<PrepareArgs>();
  auto* prepare = data->add_subcommand(
      "prepare", "Tokenize JSONL records or text files into token shards, on every core, resumable");
  prepare->add_option("INPUT", args->inputs, "Files, folders or glob patterns; *.jsonl holds records, others are text")
      ->required();
  prepare->add_option("--tokenizer", args->tokenizer, "Tokenizer directory or file ('byte': the built-in byte tokenizer)")
      ->required();
  prepare->add_option("-o,--output", args->output, "Directory for the shards (rerun the same command to resume)")
      ->required();
  prepare->add_option("--text_key,--text-key", args->text_key, "JSONL field holding a document's text")
      ->capture_default_str();
  prepare->add_flag("--per_line,--per-line", args->per_line,
                    "Text files: each non-empty line is a document (default: each file is one)");
  prepare->add_option("--shard_tokens,--shard-tokens", args->shard_tokens, "Tokens per shard file")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  prepare->add_option("--threads", args->threads, "Tokenizer threads (0: every core)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  prepare->footer(
      "Documents are separated by the tokenizer's end-of-text token; blank lines inside a\n"
      "document stay in it. The shards are the same bytes for any --threads. Train on them with\n"
      "data.source = \"OUTPUT\" (a folder of *.tokens).\n"
      "Example: colossus data prepare corpus/*.jsonl --tokenizer path/to/model --output shards/");
  return {data, [args] { return run_prepare(*args); }};
}

}  // namespace colossus::cli
