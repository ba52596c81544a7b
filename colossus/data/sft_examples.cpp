#include "colossus/data/sft_examples.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace colossus::data {

std::optional<TrainOn> parse_train_on(std::string_view name) {
  if (name == "auto") return std::nullopt;
  if (name == "assistant") return TrainOn::Assistant;
  if (name == "completion") return TrainOn::Completion;
  if (name == "all") return TrainOn::All;
  throw ConfigError(fmt::format("data.train_on is \"{}\"; valid: auto, assistant, completion, all", name));
}

Truncation parse_truncation(std::string_view name) {
  if (name == "keep_start") return Truncation::KeepStart;
  if (name == "keep_end") return Truncation::KeepEnd;
  throw ConfigError(fmt::format("data.truncation is \"{}\"; valid: keep_start, keep_end", name));
}

void SftExampleOptions::validate() const {
  if (max_length < 0) throw ConfigError(fmt::format("data.max_length is {} but must be >= 0 (0: no limit)", max_length));
}

int64_t SftExample::targets() const {
  int64_t count = 0;
  for (size_t i = 1; i < trained.size(); ++i) count += trained[i];
  return count;
}

bool SftExample::trains_nothing() const {
  return std::none_of(trained.begin(), trained.end(), [](uint8_t t) { return t != 0; });
}

SftExampleBuilder::SftExampleBuilder(const Tokenizer& tokenizer, SftExampleOptions options)
    : tokenizer_(tokenizer), options_(options) {
  options_.validate();
  const std::optional<int32_t> eos = tokenizer.eos_id();
  std::optional<std::string> text = eos ? tokenizer.id_to_token(*eos) : std::nullopt;
  if (!text) {
    throw ConfigError("the tokenizer has no end-of-text token, which SFT appends to every text and completion (as "
                      "TRL does); give a tokenizer whose tokenizer_config.json names eos_token");
  }
  eos_text_ = *text;
}

std::vector<int32_t> SftExampleBuilder::encode(const std::string& text) const {
  return tokenizer_.encode(text, /*add_special_tokens=*/true);  // as tokenizer(text) in transformers
}

void SftExampleBuilder::truncate(SftExample& example) const {
  const auto limit = static_cast<size_t>(options_.max_length);
  if (limit == 0 || example.input_ids.size() <= limit) return;
  const size_t drop = example.input_ids.size() - limit;
  if (options_.truncation == Truncation::KeepStart) {
    example.input_ids.resize(limit);
    example.trained.resize(limit);
  } else {
    example.input_ids.erase(example.input_ids.begin(), example.input_ids.begin() + static_cast<std::ptrdiff_t>(drop));
    example.trained.erase(example.trained.begin(), example.trained.begin() + static_cast<std::ptrdiff_t>(drop));
  }
}

SftExample SftExampleBuilder::build(const Record& record) const {
  const auto with_eos = [&](const std::string& text) { return text.ends_with(eos_text_) ? text : text + eos_text_; };
  SftExample example;
  switch (record.format) {
    case RecordFormat::Text: {
      if (options_.train_on && *options_.train_on != TrainOn::All) {
        throw ConfigError("data.train_on must be \"all\" (or auto) for text records: they have no completion or "
                          "assistant turns to single out");
      }
      example.input_ids = encode(with_eos(record.text));
      example.trained.assign(example.input_ids.size(), 1);
      break;
    }
    case RecordFormat::PromptCompletion: {
      if (record.prompt.conversational || record.completion.conversational) {
        throw ConfigError("conversational prompt/completion records (message lists) need the model's chat template, "
                          "which SFT does not apply yet; give prompt and completion as plain strings");
      }
      if (options_.train_on == TrainOn::Assistant) {
        throw ConfigError("data.train_on = \"assistant\" needs chat records; prompt/completion records train on "
                          "\"completion\" (the default) or \"all\"");
      }
      const std::vector<int32_t> prompt_ids = encode(record.prompt.text);
      example.input_ids = encode(record.prompt.text + with_eos(record.completion.text));
      // Tokens can merge across the boundary: the completion starts where the ids diverge.
      const auto diverge = std::mismatch(prompt_ids.begin(), prompt_ids.end(), example.input_ids.begin(),
                                         example.input_ids.end());
      const auto prompt_len = static_cast<size_t>(diverge.first - prompt_ids.begin());
      const bool all = options_.train_on == TrainOn::All;
      example.trained.assign(example.input_ids.size(), 1);
      if (!all) std::fill(example.trained.begin(), example.trained.begin() + static_cast<std::ptrdiff_t>(prompt_len), 0);
      break;
    }
    case RecordFormat::Chat:
      throw ConfigError("chat records need the model's chat template, which SFT does not apply yet; give "
                        "prompt/completion or text records");
    case RecordFormat::Preference:
      throw ConfigError("preference records (chosen/rejected) are for DPO, not SFT");
  }
  truncate(example);
  return example;
}

}  // namespace colossus::data
