// `colossus data prepare`: a corpus of any size tokenized into token shards
// (token_shards.h) as a stream. Documents are JSONL records (one text field
// each) or text files (one document a file, or a line); each document's ids
// are followed by the tokenizer's end-of-text token, and the stream is cut
// into shards of exactly shard_tokens tokens (the last one shorter). Batches
// of documents are tokenized on a thread pool and written in input order, so
// the shards are the same bytes for any thread count. After each shard a
// state file records where the next one starts (document and token offset),
// and a rerun with the same inputs, tokenizer and options resumes there.
#pragma once
#include "colossus/data/tokenizer.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace colossus::data {

struct PrepareOptions {
  // Files, folders (their regular files, sorted) or glob patterns. A *.jsonl
  // file holds records; any other file is text.
  std::vector<std::string> inputs;
  std::string output_dir;          // shards as shard-000000.tokens, ...; the state file beside them
  std::string text_key = "text";   // the JSONL field holding a document's text
  bool per_line = false;           // text files: every non-empty line a document (else the whole file)
  int64_t shard_tokens = int64_t{1} << 26;
  int threads = 0;                 // 0: every core
  int64_t batch_documents = 512;   // documents tokenized together (ordering unit)
  // Called after each batch with the totals so far (documents, tokens, input
  // bytes read); the CLI draws its progress bar from it.
  std::function<void(int64_t documents, int64_t tokens, int64_t bytes)> progress;
};

struct PrepareResult {
  int64_t documents = 0;  // in the whole output (resumed runs included)
  int64_t tokens = 0;
  int64_t bytes = 0;      // input bytes read by this call
  std::vector<std::string> shards;
  bool resumed = false;        // continued an interrupted run
  bool already_done = false;   // the state said complete; nothing was read
};

// The input files `inputs` name, in order (ConfigError for a pattern or path
// that matches none).
std::vector<std::string> expand_prepare_inputs(const std::vector<std::string>& inputs);

// ConfigError for a bad option, a record without a string `text_key` (naming
// file:line), a tokenizer without an end-of-text token, or an existing output
// whose state was made from other inputs or options (naming what differs).
PrepareResult prepare_token_shards(const Tokenizer& tokenizer, const PrepareOptions& options);

}  // namespace colossus::data
