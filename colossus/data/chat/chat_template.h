// Turning OpenAI-style chat messages into a prompt with a model's Hugging Face
// chat template, byte for byte as transformers'
// tokenizer.apply_chat_template(messages, tokenize=False, ...) does. The
// template runs on our Jinja2-subset interpreter (jinja/), configured as
// transformers configures Jinja (trim_blocks, lstrip_blocks, its tojson,
// raise_exception, strftime_now, loop controls, {% generation %}).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "colossus/core/errors.h"

namespace colossus::data::chat {

namespace jinja {
struct Stmt;
}

// Thrown by raise_exception(message) in a template; what() is exactly the
// template's message. It means the template refused the request (roles that
// do not alternate, an unsupported system message): the client's error.
struct ChatTemplateRaised : ConfigError {
  using ConfigError::ConfigError;
};

// Immutable once parsed: render() and apply() may run on several threads.
class ChatTemplate {
 public:
  // Template variables from the tokenizer: bos_token, eos_token, unk_token,
  // sep_token, pad_token, cls_token, mask_token (those the model has).
  using SpecialTokens = std::map<std::string, std::string>;

  // Parses once; throws ConfigError("chat template line L, column C: ...")
  // naming what was expected (an unclosed tag, an unknown filter or test).
  explicit ChatTemplate(std::string source, SpecialTokens special_tokens = {});

  // From a model or tokenizer directory: chat_template.jinja if present, else
  // tokenizer_config.json's chat_template (a string, or a list of
  // {name, template} of which "default" is used); special tokens from
  // tokenizer_config.json (a string or an {"content": ...} object), then
  // special_tokens_map.json for the ones it lacks. Throws ConfigError naming
  // the file when there is no template or it does not parse.
  static ChatTemplate from_model_dir(const std::string& dir);
  // from_model_dir() when the directory names a template at all, else
  // nullopt (a missing template is no error; a broken one still is).
  static std::optional<ChatTemplate> find_in_model_dir(const std::string& dir);

  // Renders with `context`'s keys as the variables. An ordered_json keeps the
  // keys' order, so `tojson` writes dicts as Python would from the same
  // request; a nlohmann::json converts implicitly (keys then sorted).
  // Throws ChatTemplateRaised, or ConfigError naming the template position
  // and the failing filter, method or type.
  std::string render(const nlohmann::ordered_json& context) const;

  // apply_chat_template(messages, tokenize=False, add_generation_prompt,
  // **extra): keys whose value is null are dropped from each message,
  // reasoning_content / thinking / reasoning are aliased as transformers does,
  // and the variables are the special tokens, messages, tools and documents
  // (None unless `extra` sets them), add_generation_prompt and `extra`'s keys
  // (enable_thinking, ...). Throws ConfigError for an empty conversation or a
  // message that is not an object.
  std::string apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // A conversation rendered with where its {% generation %} blocks (the
  // assistant turns, in templates written for training) lie: [begin, end)
  // byte offsets into `text`, in order.
  struct Rendered {
    std::string text;
    std::vector<std::pair<size_t, size_t>> generation_spans;
  };
  // apply(), recording the generation blocks' spans as transformers does for
  // apply_chat_template(..., return_assistant_tokens_mask=True).
  Rendered apply_marking_generation(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // Whether the template marks assistant turns with {% generation %}.
  bool has_generation_blocks() const;

  const std::string& source() const { return source_; }
  const SpecialTokens& special_tokens() const { return special_tokens_; }

 private:
  std::string source_;
  SpecialTokens special_tokens_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> program_;
  nlohmann::ordered_json context_for(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                     const nlohmann::ordered_json& extra) const;
  template <class Render>
  auto guarded(Render render) const;
};

}  // namespace colossus::data::chat
