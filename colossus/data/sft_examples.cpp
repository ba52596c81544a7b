#include "colossus/data/sft_examples.h"

#include "colossus/core/errors.h"
#include "colossus/data/chat/chat_template.h"
#include "colossus/data/token_offsets.h"

#include <nlohmann/json.hpp>

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
  const auto none = [](const std::vector<uint8_t>& v) { return std::none_of(v.begin(), v.end(), [](uint8_t t) { return t != 0; }); };
  return none(trained) && none(rejected_trained);
}

namespace {

nlohmann::ordered_json to_json(const std::vector<Message>& messages) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const Message& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return list;
}

// Where two token sequences part (TRL's common_prefix_length).
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

}  // namespace

SftExampleBuilder::SftExampleBuilder(const Tokenizer& tokenizer, SftExampleOptions options,
                                     const chat::ChatTemplate* chat_template)
    : tokenizer_(tokenizer), options_(options), chat_template_(chat_template) {
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

const chat::ChatTemplate& SftExampleBuilder::chat_template(const char* what) const {
  if (!chat_template_)
    throw ConfigError(fmt::format("{} need the model's chat template, and the model directory has none (no "
                                  "chat_template.jinja, no chat_template in tokenizer_config.json); add one, or give "
                                  "prompt/completion or text records",
                                  what));
  if (options_.train_on == TrainOn::Assistant && !chat_template_->has_generation_blocks())
    throw ConfigError("data.train_on = \"assistant\" needs a chat template that marks assistant turns with "
                      "{% generation %}...{% endgeneration %}, and this model's template has no such block; add the "
                      "markers around each assistant message (and its end-of-turn token), or train on \"all\"");
  return *chat_template_;
}

std::vector<int32_t> SftExampleBuilder::encode_chat(const std::vector<Message>& messages, bool add_generation_prompt,
                                                    std::vector<uint8_t>* assistant) const {
  const chat::ChatTemplate& chat = chat_template("conversations");
  if (!assistant)  // a template writes its own BOS: no special tokens added (transformers' apply_chat_template)
    return tokenizer_.encode(chat.apply(to_json(messages), add_generation_prompt), /*add_special_tokens=*/false);
  const chat::ChatTemplate::Rendered rendered = chat.apply_marking_generation(to_json(messages), add_generation_prompt);
  EncodedText encoded = encode_with_offsets(tokenizer_, rendered.text);
  *assistant = tokens_overlapping(encoded.offsets, rendered.generation_spans);
  return std::move(encoded.ids);
}

void SftExampleBuilder::truncate(std::vector<int32_t>& ids, std::vector<uint8_t>& trained) const {
  const auto limit = static_cast<size_t>(options_.max_length);
  if (limit == 0 || ids.size() <= limit) return;
  const size_t drop = ids.size() - limit;
  if (options_.truncation == Truncation::KeepStart) {
    ids.resize(limit);
    trained.resize(limit);
  } else {
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(drop));
    trained.erase(trained.begin(), trained.begin() + static_cast<std::ptrdiff_t>(drop));
  }
}

SftExample SftExampleBuilder::build_pair(const Record& record) const {
  if (record.format != RecordFormat::Preference)
    throw ConfigError(fmt::format("DPO trains on preference records (prompt, chosen, rejected); this record is {}",
                                  format_name(record.format)));
  if (options_.train_on && *options_.train_on != TrainOn::Completion)
    throw ConfigError("DPO scores the chosen and rejected completions: data.train_on must be \"completion\" (or auto)");
  const Segment& prompt = record.prompt;
  if (prompt.conversational != record.chosen.conversational || prompt.conversational != record.rejected.conversational)
    throw ConfigError("a preference record needs prompt, chosen and rejected all as message lists or all as strings");
  std::vector<int32_t> prompt_ids, chosen_ids, rejected_ids;
  if (prompt.conversational) {
    const auto joined = [&](const Segment& completion) {
      std::vector<Message> whole = prompt.messages;
      whole.insert(whole.end(), completion.messages.begin(), completion.messages.end());
      return whole;
    };
    prompt_ids = encode_chat(prompt.messages, /*add_generation_prompt=*/true, nullptr);
    chosen_ids = encode_chat(joined(record.chosen), /*add_generation_prompt=*/false, nullptr);
    rejected_ids = encode_chat(joined(record.rejected), /*add_generation_prompt=*/false, nullptr);
  } else {
    const auto with_eos = [&](const std::string& text) { return text.ends_with(eos_text_) ? text : text + eos_text_; };
    prompt_ids = encode(prompt.text);
    chosen_ids = encode(prompt.text + with_eos(record.chosen.text));
    rejected_ids = encode(prompt.text + with_eos(record.rejected.text));
  }
  // Tokens can merge across the boundary: the completions start where either parts from the prompt.
  const size_t prompt_len = std::min(common_prefix(prompt_ids, chosen_ids), common_prefix(prompt_ids, rejected_ids));
  SftExample pair;
  pair.input_ids = std::move(chosen_ids);
  pair.rejected_ids = std::move(rejected_ids);
  const auto mark_completion = [&](std::vector<int32_t>& ids, std::vector<uint8_t>& trained) {
    trained.assign(ids.size(), 1);
    std::fill(trained.begin(), trained.begin() + static_cast<std::ptrdiff_t>(std::min(prompt_len, ids.size())), 0);
    truncate(ids, trained);
  };
  mark_completion(pair.input_ids, pair.trained);
  mark_completion(pair.rejected_ids, pair.rejected_trained);
  return pair;
}

SftExample SftExampleBuilder::build(const Record& record) const {
  if (options_.preference_pairs) return build_pair(record);
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
      if (record.prompt.conversational != record.completion.conversational)
        throw ConfigError("a prompt/completion record needs both as message lists or both as strings");
      if (record.prompt.conversational) {
        const bool assistant = options_.train_on == TrainOn::Assistant;
        const std::vector<int32_t> prompt_ids = encode_chat(record.prompt.messages, /*add_generation_prompt=*/true, nullptr);
        std::vector<Message> whole = record.prompt.messages;
        whole.insert(whole.end(), record.completion.messages.begin(), record.completion.messages.end());
        std::vector<uint8_t> in_generation;
        example.input_ids = encode_chat(whole, /*add_generation_prompt=*/false, assistant ? &in_generation : nullptr);
        const size_t prompt_len = common_prefix(prompt_ids, example.input_ids);
        example.trained.assign(example.input_ids.size(), 1);
        if (options_.train_on != TrainOn::All)
          std::fill(example.trained.begin(), example.trained.begin() + static_cast<std::ptrdiff_t>(prompt_len), 0);
        if (assistant)
          for (size_t i = 0; i < example.trained.size(); ++i) example.trained[i] &= in_generation[i];
        break;
      }
      if (options_.train_on == TrainOn::Assistant) {
        throw ConfigError("data.train_on = \"assistant\" needs chat records; prompt/completion records train on "
                          "\"completion\" (the default) or \"all\"");
      }
      const std::vector<int32_t> prompt_ids = encode(record.prompt.text);
      example.input_ids = encode(record.prompt.text + with_eos(record.completion.text));
      // Tokens can merge across the boundary: the completion starts where the ids diverge.
      const size_t prompt_len = common_prefix(prompt_ids, example.input_ids);
      const bool all = options_.train_on == TrainOn::All;
      example.trained.assign(example.input_ids.size(), 1);
      if (!all) std::fill(example.trained.begin(), example.trained.begin() + static_cast<std::ptrdiff_t>(prompt_len), 0);
      break;
    }
    case RecordFormat::Chat: {
      if (options_.train_on == TrainOn::Completion)
        throw ConfigError("data.train_on = \"completion\" needs prompt/completion records; chat records train on "
                          "\"assistant\" (the assistant turns) or \"all\" (the default)");
      if (options_.train_on == TrainOn::Assistant) {
        example.input_ids = encode_chat(record.messages, /*add_generation_prompt=*/false, &example.trained);
      } else {
        example.input_ids = encode_chat(record.messages, /*add_generation_prompt=*/false, nullptr);
        example.trained.assign(example.input_ids.size(), 1);
      }
      break;
    }
    case RecordFormat::Preference:
      throw ConfigError("preference records (chosen/rejected) are for DPO (train.task = \"dpo\"), not SFT");
  }
  truncate(example.input_ids, example.trained);
  return example;
}

}  // namespace colossus::data
