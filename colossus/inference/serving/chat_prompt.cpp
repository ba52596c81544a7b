// Chat template or plain concatenation; see chat_prompt.h.
#include "colossus/inference/serving/chat_prompt.h"

#include <filesystem>
#include <fstream>

namespace colossus::inference::serving {

namespace {

// Whether the directory names a template at all (so a missing one falls back
// while a broken one is still reported).
bool has_template_files(const std::filesystem::path& dir) {
  if (std::filesystem::is_regular_file(dir / "chat_template.jinja")) return true;
  std::ifstream config(dir / "tokenizer_config.json");
  if (!config) return false;
  const auto parsed = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
  return parsed.is_object() && parsed.contains("chat_template") && !parsed["chat_template"].is_null();
}

}  // namespace

ChatPrompt ChatPrompt::from_model_dir(const std::string& model_dir) {
  if (!has_template_files(model_dir)) return ChatPrompt();
  return ChatPrompt(ChatTemplate::from_model_dir(model_dir));
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
