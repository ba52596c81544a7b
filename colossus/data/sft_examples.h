// Supervised fine-tuning examples: a JSONL record turned into token ids and
// the tokens trained on, as TRL's SFTTrainer prepares them (its end-of-text
// token appended to plain text, conversations rendered by the model's chat
// template, the prompt/completion split where the two tokenizations diverge,
// assistant turns marked by the template's {% generation %} blocks,
// truncation to max_length).
#pragma once
#include "colossus/data/jsonl_records.h"
#include "colossus/data/tokenizer.h"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace colossus::data {

namespace chat {
class ChatTemplate;
}

// Which tokens carry the loss: the assistant turns of a conversation, the
// completion of a prompt/completion record, or every token.
enum class TrainOn { Assistant, Completion, All };
// "assistant", "completion", "all"; nullopt for "auto" (TRL's defaults: the
// completion of prompt/completion records, every token of text and chat
// records).
// Anything else: ConfigError listing the valid names.
std::optional<TrainOn> parse_train_on(std::string_view name);

// Which end of an over-long example is kept (TRL's truncation_mode).
enum class Truncation { KeepStart, KeepEnd };
Truncation parse_truncation(std::string_view name);  // "keep_start" | "keep_end"

struct SftExampleOptions {
  std::optional<TrainOn> train_on;  // nullopt: auto
  int64_t max_length = 1024;        // tokens kept per example (TRL's SFTConfig default); 0: no limit
  Truncation truncation = Truncation::KeepStart;
  // DPO: preference records only, each built into its chosen and rejected
  // sequences (as TRL's DPOTrainer prepares them).
  bool preference_pairs = false;
  void validate() const;
};

// input_ids[i] is trained on (is a target of the causal-LM loss) where
// trained[i] is 1; a model's first position is never a target. A preference
// pair (DPO) holds the prompt + chosen completion in input_ids (trained: the
// completion, whose log-probability DPO scores) and the prompt + rejected
// completion in rejected_ids / rejected_trained.
struct SftExample {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> trained;
  std::vector<int32_t> rejected_ids;
  std::vector<uint8_t> rejected_trained;
  int64_t targets() const;  // trained tokens after the first position
  // No token trained (e.g. a prompt truncated past max_length): TRL drops
  // such examples, and so do the SFT batches (counting them). A pair: neither
  // sequence has a completion token left.
  bool trains_nothing() const;
};

// Turns records into examples with one tokenizer. Immutable: shareable by
// tokenizing threads.
class SftExampleBuilder {
 public:
  // Throws ConfigError when the tokenizer has no end-of-text token (TRL
  // appends it to every text and completion). `chat_template` (may be null:
  // conversations are then refused) renders conversational records; both
  // must outlive the builder.
  SftExampleBuilder(const Tokenizer& tokenizer, SftExampleOptions options,
                    const chat::ChatTemplate* chat_template = nullptr);

  // text: ids of text + eos (unless it ends with it), all trained.
  // prompt_completion (plain strings): ids of prompt + completion + eos; the
  // completion starts where they diverge from the prompt's own ids (tokens
  // may merge across the boundary, as TRL's common_prefix_length); trained:
  // the completion (train_on completion, the default) or all.
  // chat: the template's rendering of the messages, tokenized without special
  // tokens (the template writes them), no eos added; trained: all (the
  // default) or the tokens overlapping the template's {% generation %}
  // blocks (train_on assistant; a template without them is refused).
  // Conversational prompt/completion: the prompt rendered with the generation
  // prompt against prompt + completion rendered whole, split where they
  // diverge; trained: the completion (default), all, or the completion's
  // tokens inside generation blocks (assistant, as TRL's assistant_only_loss
  // with its default completion_only_loss).
  // Preference records belong to DPO (options.preference_pairs), and are
  // then the only records taken: prompt (with its generation prompt when
  // conversational) against prompt + chosen and prompt + rejected, the
  // completions starting where either diverges from the prompt (TRL's
  // DPOTrainer), eos appended to plain-string completions; each sequence
  // truncated to max_length.
  SftExample build(const Record& record) const;

 private:
  const Tokenizer& tokenizer_;
  SftExampleOptions options_;
  const chat::ChatTemplate* chat_template_;
  std::string eos_text_;
  std::vector<int32_t> encode(const std::string& text) const;
  const chat::ChatTemplate& chat_template(const char* what) const;
  // messages rendered and tokenized; `assistant`: 1 for tokens in generation blocks (when marking).
  std::vector<int32_t> encode_chat(const std::vector<Message>& messages, bool add_generation_prompt,
                                   std::vector<uint8_t>* assistant) const;
  void truncate(std::vector<int32_t>& ids, std::vector<uint8_t>& trained) const;
  SftExample build_pair(const Record& record) const;
};

}  // namespace colossus::data
