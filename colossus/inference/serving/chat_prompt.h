// A conversation turned into prompt text: through the model directory's chat
// template when it has one, else plain concatenation ("role: content" lines,
// then "assistant:"), for `colossus serve` and `colossus generate --chat`.
#pragma once
#include "colossus/data/chat/chat_template.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace colossus::inference::serving {

using data::chat::ChatTemplate;

class ChatPrompt {
 public:
  // Looks for a template in `model_dir` (see ChatTemplate::from_model_dir);
  // none there is not an error (the fallback is used), a broken one is.
  static ChatPrompt from_model_dir(const std::string& model_dir);
  ChatPrompt() = default;
  explicit ChatPrompt(std::optional<ChatTemplate> chat_template) : template_(std::move(chat_template)) {}

  // messages: [{role, content}, ...]. Throws ChatTemplateRaised / ConfigError from the template.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt = true,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  bool has_template() const { return template_.has_value(); }
  // A template writes its own BOS and the like, so its text is encoded without
  // the tokenizer's special tokens (as transformers' apply_chat_template(tokenize=True)).
  bool add_special_tokens() const { return !template_.has_value(); }

 private:
  std::optional<ChatTemplate> template_;
};

}  // namespace colossus::inference::serving
