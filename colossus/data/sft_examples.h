// Supervised fine-tuning examples: a JSONL record turned into token ids and
// the tokens trained on, as TRL's SFTTrainer prepares them (its end-of-text
// token appended, the prompt/completion split where the two tokenizations
// diverge, truncation to max_length).
#pragma once
#include "colossus/data/jsonl_records.h"
#include "colossus/data/tokenizer.h"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace colossus::data {

// Which tokens carry the loss: the assistant turns of a conversation, the
// completion of a prompt/completion record, or every token.
enum class TrainOn { Assistant, Completion, All };
// "assistant", "completion", "all"; nullopt for "auto" (TRL's defaults: the
// completion of prompt/completion records, every token of text records).
// Anything else: ConfigError listing the valid names.
std::optional<TrainOn> parse_train_on(std::string_view name);

// Which end of an over-long example is kept (TRL's truncation_mode).
enum class Truncation { KeepStart, KeepEnd };
Truncation parse_truncation(std::string_view name);  // "keep_start" | "keep_end"

struct SftExampleOptions {
  std::optional<TrainOn> train_on;  // nullopt: auto
  int64_t max_length = 1024;        // tokens kept per example (TRL's SFTConfig default); 0: no limit
  Truncation truncation = Truncation::KeepStart;
  void validate() const;
};

// input_ids[i] is trained on (is a target of the causal-LM loss) where
// trained[i] is 1; a model's first position is never a target.
struct SftExample {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> trained;
  int64_t targets() const;  // trained tokens after the first position
  // No token trained (e.g. a prompt truncated past max_length): TRL drops
  // such examples, and so do the SFT batches (counting them).
  bool trains_nothing() const;
};

// Turns records into examples with one tokenizer. Immutable: shareable by
// tokenizing threads.
class SftExampleBuilder {
 public:
  // Throws ConfigError when the tokenizer has no end-of-text token (TRL
  // appends it to every text and completion).
  SftExampleBuilder(const Tokenizer& tokenizer, SftExampleOptions options);

  // text: ids of text + eos (unless it ends with it), all trained.
  // prompt_completion (plain strings): ids of prompt + completion + eos; the
  // completion starts where they diverge from the prompt's own ids (tokens
  // may merge across the boundary, as TRL's common_prefix_length); trained:
  // the completion (train_on completion, the default) or all. Conversational
  // records (chat, message lists) need the model's chat template and are
  // refused by name here; preference records belong to DPO.
  SftExample build(const Record& record) const;

 private:
  const Tokenizer& tokenizer_;
  SftExampleOptions options_;
  std::string eos_text_;
  std::vector<int32_t> encode(const std::string& text) const;
  void truncate(SftExample& example) const;
};

}  // namespace colossus::data
