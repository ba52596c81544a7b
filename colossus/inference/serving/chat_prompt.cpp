// Chat template or plain concatenation; see chat_prompt.h.
#include "colossus/inference/serving/chat_prompt.h"

namespace colossus::inference::serving {

ChatPrompt ChatPrompt::from_model_dir(const std::string& model_dir) {
  return ChatPrompt(ChatTemplate::find_in_model_dir(model_dir));
}

std::string ChatPrompt::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra) const {
  if (template_) return template_->apply(messages, add_generation_prompt, extra);
  std::string text;
  for (const auto& message : messages) {
    text += message.value("role", "user") + ": " + message.value("content", "") + "\n";
  }
  if (add_generation_prompt) text += "assistant:";
  return text;
}

}  // namespace colossus::inference::serving
