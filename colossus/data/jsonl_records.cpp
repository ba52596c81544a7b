#include "colossus/data/jsonl_records.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <type_traits>

namespace colossus::data {

using nlohmann::json;

namespace {

constexpr std::array<std::string_view, 4> kRoles = {"system", "user", "assistant", "tool"};

// The keys that say which format a record has; any other key is metadata.
constexpr std::array<std::string_view, 7> kFormatKeys = {"messages", "system", "prompt", "completion",
                                                         "text",     "chosen", "rejected"};

const char* needs(RecordFormat format) {
  switch (format) {
    case RecordFormat::Chat: return "chat needs \"messages\" (a list of {\"role\", \"content\"}, optional \"system\")";
    case RecordFormat::PromptCompletion: return "prompt_completion needs \"prompt\" and \"completion\"";
    case RecordFormat::Text: return "text needs \"text\"";
    case RecordFormat::Preference:
      return "preference needs \"chosen\" and \"rejected\" (optional \"prompt\" or \"messages\")";
  }
  return "";
}

std::string all_needs() {
  return fmt::format("{}; {}; {}; {}", needs(RecordFormat::Chat), needs(RecordFormat::PromptCompletion),
                     needs(RecordFormat::Text), needs(RecordFormat::Preference));
}

std::string keys_of(const json& object) {
  std::string keys;
  for (const auto& item : object.items()) keys += fmt::format("{}\"{}\"", keys.empty() ? "" : ", ", item.key());
  return keys.empty() ? "none" : keys;
}

// A value as it appears in the file, cut short (at a character boundary) so a
// long string does not flood the message.
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  if (text.size() <= kMax) return text;
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

[[noreturn]] void fail(const std::string& what) { throw ConfigError(what); }

std::string text_of_content(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    fail(fmt::format("{}.content is {}, expected a string or a list of {{\"type\": \"text\", \"text\": ...}} parts",
                     where, shown(content)));
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = fmt::format("{}.content[{}]", where, i);
    if (!part.is_object()) {
      fail(fmt::format("{} is {}, expected a {{\"type\": \"text\", \"text\": ...}} part", at, shown(part)));
    }
    auto type = part.find("type");
    if (type == part.end()) {
      fail(fmt::format("{} has no \"type\"; only {{\"type\": \"text\", \"text\": ...}} parts are read", at));
    }
    if (!type->is_string() || type->get<std::string>() != "text") {
      fail(fmt::format("{}.type is {}; only \"text\" parts are read", at, shown(*type)));
    }
    auto part_text = part.find("text");
    if (part_text == part.end()) fail(fmt::format("{} has no \"text\"", at));
    if (!part_text->is_string()) fail(fmt::format("{}.text is {}, expected a string", at, shown(*part_text)));
    text += part_text->get<std::string>();
  }
  return text;
}

std::vector<Message> parse_messages(const json& list, const std::string& where) {
  if (!list.is_array()) fail(fmt::format("{} is {}, expected a list of messages", where, shown(list)));
  if (list.empty()) fail(fmt::format("{} is an empty list, expected at least one message", where));
  std::vector<Message> messages;
  messages.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& item = list[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!item.is_object()) {
      fail(fmt::format("{} is {}, expected an object with \"role\" and \"content\"", at, shown(item)));
    }
    auto role = item.find("role");
    if (role == item.end()) fail(fmt::format("{} has no \"role\"", at));
    if (!role->is_string()) fail(fmt::format("{}.role is {}, expected a string", at, shown(*role)));
    const auto role_name = role->get<std::string>();
    if (std::find(kRoles.begin(), kRoles.end(), role_name) == kRoles.end()) {
      fail(fmt::format("{}.role is {}, expected one of \"system\", \"user\", \"assistant\", \"tool\"", at,
                       shown(*role)));
    }
    auto content = item.find("content");
    if (content == item.end()) fail(fmt::format("{} has no \"content\"", at));
    messages.push_back({role_name, text_of_content(*content, at)});
  }
  return messages;
}

Segment parse_segment(const json& value, std::string_view key) {
  const std::string where = fmt::format("\"{}\"", key);
  if (value.is_string()) return {.conversational = false, .text = value.get<std::string>()};
  if (value.is_array()) return {.conversational = true, .messages = parse_messages(value, where)};
  fail(fmt::format("{} is {}, expected a string or a list of messages", where, shown(value)));
}

std::string form(const Segment& segment) { return segment.conversational ? "a list of messages" : "a string"; }

const json& require(const json& object, std::string_view key, RecordFormat format) {
  auto it = object.find(key);
  if (it == object.end()) fail(fmt::format("missing \"{}\"; {} (keys found: {})", key, needs(format), keys_of(object)));
  return *it;
}

// Keys that belong to another format than `format` are a mixed-up line.
void refuse_foreign_keys(const json& object, RecordFormat format, std::initializer_list<std::string_view> own) {
  for (auto key : kFormatKeys) {
    if (object.contains(key) && std::find(own.begin(), own.end(), key) == own.end()) {
      fail(fmt::format("\"{}\" does not belong in a {} record (keys found: {}); {}", key, format_name(format),
                       keys_of(object), needs(format)));
    }
  }
}

// TRL's extract_prompt: the longest shared prefix of chosen and rejected is the
// prompt (less a trailing space before the split); when neither diverges
// within the shorter one, TRL's loop leaves the split at its last element.
// Strings split at a character, never inside one.
template <typename Seq>
size_t shared_prefix(const Seq& chosen, const Seq& rejected) {
  const size_t n = std::min(chosen.size(), rejected.size());
  size_t idx = n - 1;
  [[maybe_unused]] bool diverged = false;
  for (size_t i = 0; i < n; ++i) {
    if (!(chosen[i] == rejected[i])) {
      idx = i;
      diverged = true;
      break;
    }
  }
  if constexpr (std::is_same_v<Seq, std::string>) {
    while (idx > 0 && (static_cast<unsigned char>(chosen[idx]) & 0xC0) == 0x80) --idx;
    if (diverged && idx > 0 && chosen[idx - 1] == ' ') --idx;
  }
  return idx;
}

void extract_prompt(Record& record) {
  Segment& chosen = record.chosen;
  Segment& rejected = record.rejected;
  const bool conversational = chosen.conversational;
  const size_t chosen_size = conversational ? chosen.messages.size() : chosen.text.size();
  const size_t rejected_size = conversational ? rejected.messages.size() : rejected.text.size();
  if (chosen_size == 0 || rejected_size == 0) {
    fail(fmt::format("no \"prompt\" and \"{}\" is empty, so no prompt can be extracted from \"chosen\" and "
                     "\"rejected\"",
                     chosen_size == 0 ? "chosen" : "rejected"));
  }
  record.prompt = Segment{.conversational = conversational};
  if (conversational) {
    const size_t idx = shared_prefix(chosen.messages, rejected.messages);
    record.prompt.messages.assign(chosen.messages.begin(), chosen.messages.begin() + static_cast<std::ptrdiff_t>(idx));
    chosen.messages.erase(chosen.messages.begin(), chosen.messages.begin() + static_cast<std::ptrdiff_t>(idx));
    rejected.messages.erase(rejected.messages.begin(), rejected.messages.begin() + static_cast<std::ptrdiff_t>(idx));
  } else {
    const size_t idx = shared_prefix(chosen.text, rejected.text);
    record.prompt.text = chosen.text.substr(0, idx);
    chosen.text.erase(0, idx);
    rejected.text.erase(0, idx);
  }
}

}  // namespace

std::optional<RecordFormat> parse_record_format(std::string_view name) {
  if (name == "auto") return std::nullopt;
  if (name == "chat") return RecordFormat::Chat;
  if (name == "prompt_completion") return RecordFormat::PromptCompletion;
  if (name == "text") return RecordFormat::Text;
  if (name == "preference") return RecordFormat::Preference;
  throw ConfigError(fmt::format("record format '{}' is not one of \"auto\", \"chat\", \"prompt_completion\", "
                                "\"text\", \"preference\"",
                                name));
}

std::string_view format_name(RecordFormat format) {
  switch (format) {
    case RecordFormat::Chat: return "chat";
    case RecordFormat::PromptCompletion: return "prompt_completion";
    case RecordFormat::Text: return "text";
    case RecordFormat::Preference: return "preference";
  }
  return "?";
}

RecordFormat detect_format(const json& object) {
  if (!object.is_object()) fail(fmt::format("a record is {}, expected a JSON object", shown(object)));
  const bool preference = object.contains("chosen") || object.contains("rejected");
  const bool chat = object.contains("messages");
  const bool prompt_completion = object.contains("prompt") || object.contains("completion");
  const bool text = object.contains("text");
  // A preference record may carry its prompt as "prompt" or "messages".
  const int matches = preference ? 1 + (object.contains("completion") || text)
                                 : int{chat} + int{prompt_completion} + int{text};
  if (matches == 1) {
    if (preference) return RecordFormat::Preference;
    if (chat) return RecordFormat::Chat;
    return prompt_completion ? RecordFormat::PromptCompletion : RecordFormat::Text;
  }
  fail(fmt::format("{} record format from keys {}: {}; set the format explicitly or fix the record",
                   matches == 0 ? "cannot tell the" : "ambiguous", keys_of(object), all_needs()));
}

Record parse_record(const json& object, RecordFormat format) {
  if (!object.is_object()) fail(fmt::format("a record is {}, expected a JSON object", shown(object)));
  Record record{.format = format};
  switch (format) {
    case RecordFormat::Chat: {
      refuse_foreign_keys(object, format, {"messages", "system"});
      record.messages = parse_messages(require(object, "messages", format), "\"messages\"");
      if (auto system = object.find("system"); system != object.end()) {
        if (!system->is_string()) fail(fmt::format("\"system\" is {}, expected a string", shown(*system)));
        if (record.messages.front().role == "system") {
          fail("\"system\" is given and \"messages\"[0] is a system message too; give the system prompt once");
        }
        record.messages.insert(record.messages.begin(), Message{"system", system->get<std::string>()});
      }
      break;
    }
    case RecordFormat::PromptCompletion: {
      refuse_foreign_keys(object, format, {"prompt", "completion"});
      record.prompt = parse_segment(require(object, "prompt", format), "prompt");
      record.completion = parse_segment(require(object, "completion", format), "completion");
      if (record.prompt.conversational != record.completion.conversational) {
        fail(fmt::format("\"prompt\" is {} but \"completion\" is {}; give both in one form", form(record.prompt),
                         form(record.completion)));
      }
      break;
    }
    case RecordFormat::Text: {
      refuse_foreign_keys(object, format, {"text"});
      const json& text = require(object, "text", format);
      if (!text.is_string()) fail(fmt::format("\"text\" is {}, expected a string", shown(text)));
      record.text = text.get<std::string>();
      break;
    }
    case RecordFormat::Preference: {
      refuse_foreign_keys(object, format, {"chosen", "rejected", "prompt", "messages"});
      if (object.contains("prompt") && object.contains("messages")) {
        fail("both \"prompt\" and \"messages\" are given; a preference record's prompt is one of them");
      }
      record.chosen = parse_segment(require(object, "chosen", format), "chosen");
      record.rejected = parse_segment(require(object, "rejected", format), "rejected");
      if (record.chosen.conversational != record.rejected.conversational) {
        fail(fmt::format("\"chosen\" is {} but \"rejected\" is {}; give both in one form", form(record.chosen),
                         form(record.rejected)));
      }
      std::optional<Segment> prompt;
      if (auto it = object.find("prompt"); it != object.end()) prompt = parse_segment(*it, "prompt");
      if (auto it = object.find("messages"); it != object.end()) {
        prompt = Segment{.conversational = true, .messages = parse_messages(*it, "\"messages\"")};
      }
      // TRL's maybe_extract_prompt: a prompt in the same form as chosen is
      // explicit; without one, or in the other form, the prompt is the shared
      // prefix of chosen and rejected.
      if (prompt && prompt->conversational == record.chosen.conversational) {
        record.prompt = std::move(*prompt);
      } else {
        extract_prompt(record);
      }
      break;
    }
  }
  return record;
}

}  // namespace colossus::data
