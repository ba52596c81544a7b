// The record formats of post-training JSONL datasets, read as TRL and
// ColossalChat read them: chat (messages), prompt/completion, plain text and
// preference (chosen/rejected), each line one JSON object parsed into a Record.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

enum class RecordFormat { Chat, PromptCompletion, Text, Preference };

// "chat", "prompt_completion", "text", "preference"; nullopt for "auto" (detect
// from the first record). Anything else: ConfigError listing the valid names.
std::optional<RecordFormat> parse_record_format(std::string_view name);
std::string_view format_name(RecordFormat format);

// One turn of a conversation. Roles are system / user / assistant / tool;
// content is text (a list of {"type": "text", "text": ...} parts is joined).
struct Message {
  std::string role;
  std::string content;
  bool operator==(const Message&) const = default;
};

// A prompt, completion, chosen or rejected part: a plain string (TRL's
// "standard" form) or a list of messages (its "conversational" form).
struct Segment {
  bool conversational = false;
  std::string text;               // when !conversational
  std::vector<Message> messages;  // when conversational
  bool operator==(const Segment&) const = default;
};

struct Record {
  RecordFormat format = RecordFormat::Text;
  std::vector<Message> messages;  // Chat: the conversation, a top-level "system" as its first message
  std::string text;               // Text
  Segment prompt;                 // PromptCompletion, Preference (extracted from chosen/rejected when implicit)
  Segment completion;             // PromptCompletion
  Segment chosen, rejected;       // Preference: the continuations after the prompt
};

// The format a record with these keys has: "chosen"/"rejected" -> preference,
// "messages" -> chat, "prompt"/"completion" -> prompt_completion, "text" ->
// text. Keys of two formats (e.g. "text" and "messages") or of none: a
// ConfigError naming the keys found and what each format needs.
RecordFormat detect_format(const nlohmann::json& first_object);

// Parses one line's object. Keys that belong to no format are ignored; a key of
// another format mixed in, a missing key or a value of the wrong type is a
// ConfigError whose message says where in the record (`"messages"[2].role is
// 42, expected a string`), without the file and line (the caller adds them).
Record parse_record(const nlohmann::json& object, RecordFormat format);

}  // namespace colossus::data
