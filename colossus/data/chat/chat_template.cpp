#include "colossus/data/chat/chat_template.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "colossus/data/chat/jinja/eval.h"
#include "colossus/data/chat/jinja/parser.h"

namespace colossus::data::chat {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

// transformers' SPECIAL_TOKENS_ATTRIBUTES.
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("cannot read {}", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

ordered_json read_json(const fs::path& path) {
  try {
    return ordered_json::parse(read_text(path));
  } catch (const ordered_json::exception& e) {
    throw ConfigError(fmt::format("{} is not valid JSON: {}", path.string(), e.what()));
  }
}

// A special token is saved as "<s>" or as an AddedToken {"content": "<s>", ...}.
void add_special_tokens(const ordered_json& config, ChatTemplate::SpecialTokens& tokens) {
  for (const char* name : kSpecialTokenNames) {
    if (tokens.count(name) || !config.contains(name)) continue;
    const ordered_json& value = config[name];
    if (value.is_string())
      tokens[name] = value.get<std::string>();
    else if (value.is_object() && value.contains("content") && value["content"].is_string())
      tokens[name] = value["content"].get<std::string>();
  }
}

// tokenizer_config.json's chat_template: a string, or named templates of
// which transformers uses "default" when no name is asked for.
std::string template_from_config(const ordered_json& config, const fs::path& path) {
  if (!config.contains("chat_template") || config["chat_template"].is_null())
    throw ConfigError(
        fmt::format("{} has no chat_template (and there is no chat_template.jinja beside it)", path.string()));
  const ordered_json& value = config["chat_template"];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string names;
    for (const ordered_json& entry : value) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template")) continue;
      const std::string name = entry["name"].is_string() ? entry["name"].get<std::string>() : "";
      if (name == "default" && entry["template"].is_string()) return entry["template"].get<std::string>();
      names += (names.empty() ? "" : ", ") + name;
    }
    throw ConfigError(
        fmt::format("{}: chat_template lists templates ({}) but none is named \"default\"", path.string(), names));
  }
  throw ConfigError(
      fmt::format("{}: chat_template must be a string or a list of {{\"name\", \"template\"}} "
                  "objects, got {}",
                  path.string(), value.dump()));
}

// _normalize_chat_messages and _alias_reasoning_fields of transformers.
ordered_json normalize_messages(const ordered_json& messages) {
  if (!messages.is_array())
    throw ConfigError(fmt::format("chat messages must be a list, got {}", messages.type_name()));
  if (messages.empty()) throw ConfigError("cannot apply a chat template to an empty conversation");
  ordered_json out = ordered_json::array();
  for (const ordered_json& message : messages) {
    if (!message.is_object()) throw ConfigError(fmt::format("chat messages must be objects, got {}", message.dump()));
    ordered_json kept = ordered_json::object();
    for (const auto& [key, value] : message.items())
      if (!value.is_null()) kept[key] = value;
    const ordered_json* reasoning = nullptr;
    for (const char* field : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && kept.contains(field)) reasoning = &kept[field];
    if (reasoning) {  // {"thinking": r, **message, "reasoning_content": r}
      ordered_json aliased = ordered_json::object();
      aliased["thinking"] = *reasoning;
      for (const auto& [key, value] : kept.items()) aliased[key] = value;
      aliased["reasoning_content"] = *reasoning;
      kept = std::move(aliased);
    }
    out.push_back(std::move(kept));
  }
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, SpecialTokens special_tokens)
    : source_(std::move(source)), special_tokens_(std::move(special_tokens)) {
  program_ = std::make_shared<const jinja::Body>(jinja::parse(jinja::tokenize(source_)));
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  const bool has_config = fs::exists(config_path);
  if (!has_config && !fs::exists(jinja_path))
    throw ConfigError(fmt::format("no chat template in {}: neither {} nor {} exists", dir,
                                  config_path.filename().string(), jinja_path.filename().string()));
  const ordered_json config = has_config ? read_json(config_path) : ordered_json::object();
  SpecialTokens tokens;
  add_special_tokens(config, tokens);
  if (const fs::path map_path = fs::path(dir) / "special_tokens_map.json"; fs::exists(map_path))
    add_special_tokens(read_json(map_path), tokens);
  const bool from_file = fs::exists(jinja_path);
  const fs::path source_path = from_file ? jinja_path : config_path;
  std::string source = from_file ? read_text(jinja_path) : template_from_config(config, config_path);
  try {
    return ChatTemplate(std::move(source), std::move(tokens));
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: {}", source_path.string(), e.what()));
  }
}

// EvalError outside any expression (the context), or a bug: a ConfigError, never a crash.
template <class Render>
auto ChatTemplate::guarded(Render render) const {
  try {
    return render();
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("chat template: {}", e.what()));
  }
}

std::optional<ChatTemplate> ChatTemplate::find_in_model_dir(const std::string& dir) {
  bool named = fs::is_regular_file(fs::path(dir) / "chat_template.jinja");
  if (std::ifstream config(fs::path(dir) / "tokenizer_config.json"); !named && config) {
    const auto parsed = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
    named = parsed.is_object() && parsed.contains("chat_template") && !parsed["chat_template"].is_null();
  }
  if (!named) return std::nullopt;
  return from_model_dir(dir);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return guarded([&] { return jinja::render(*program_, context); });
}

ordered_json ChatTemplate::context_for(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                       const nlohmann::ordered_json& extra) const {
  if (!extra.is_object())
    throw ConfigError(fmt::format("chat template variables must be an object, got {}", extra.dump()));
  for (const char* reserved : {"messages", "add_generation_prompt"})
    if (extra.contains(reserved))
      throw ConfigError(fmt::format("'{}' is an argument of apply(), not an extra template variable", reserved));
  ordered_json context = ordered_json::object();
  for (const auto& [name, token] : special_tokens_) context[name] = token;
  context["messages"] = normalize_messages(messages);
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [key, value] : extra.items()) context[key] = value;
  return context;
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra) const {
  return render(context_for(messages, add_generation_prompt, extra));
}

ChatTemplate::Rendered ChatTemplate::apply_marking_generation(const nlohmann::ordered_json& messages,
                                                              bool add_generation_prompt,
                                                              const nlohmann::ordered_json& extra) const {
  const ordered_json context = context_for(messages, add_generation_prompt, extra);
  Rendered rendered;
  rendered.text = guarded([&] { return jinja::render(*program_, context, rendered.generation_spans); });
  return rendered;
}

bool ChatTemplate::has_generation_blocks() const { return jinja::has_generation_block(*program_); }

}  // namespace colossus::data::chat
