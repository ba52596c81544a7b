// OpenAI request parsing and response objects; see openai_api.h.
#include "colossus/inference/serving/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace colossus::inference::serving {

namespace {

using json = nlohmann::json;

const char* type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

ApiError wrong_type(const std::string& field, const json& value, const char* expected) {
  return ApiError(400, fmt::format("'{}' must be {}, not {}", field, expected, type_name(value)), field);
}

// The field's value, or nullptr when it is absent or null.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number_field(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  if (!value->is_number()) throw wrong_type(name, *value, "a number");
  return value->get<double>();
}

std::optional<int64_t> integer_field(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  if (value->is_number_float()) {
    const double d = value->get<double>();
    if (d != static_cast<double>(static_cast<int64_t>(d))) throw wrong_type(name, *value, "an integer");
    return static_cast<int64_t>(d);
  }
  if (!value->is_number_integer()) throw wrong_type(name, *value, "an integer");
  if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw ApiError(400, fmt::format("'{}' is too large", name), name);
  }
  return value->get<int64_t>();
}

std::optional<bool> bool_field(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) throw wrong_type(name, *value, "a boolean");
  return value->get<bool>();
}

json parse_body(const std::string& body) {
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON ({})", e.what()));
  }
  if (!parsed.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, not {}", type_name(parsed)));
  return parsed;
}

// OpenAI options this server does not implement: accepted only at their no-op values.
void refuse_unsupported(const json& body) {
  if (auto best_of = integer_field(body, "best_of"); best_of && *best_of != 1) {
    throw ApiError(400, fmt::format("best_of = {} is not supported; use 1 (n > 1 returns several samples)", *best_of),
                   "best_of");
  }
  for (const char* name : {"suffix", "tools", "functions", "response_format"}) {
    const json* value = field(body, name);
    if (value && !(value->is_boolean() && !value->get<bool>())) {
      throw ApiError(400, fmt::format("'{}' is not supported by this server; leave it out", name), name);
    }
  }
  if (const json* bias = field(body, "logit_bias"); bias && !(bias->is_object() && bias->empty())) {
    throw ApiError(400, "'logit_bias' is not supported by this server; leave it out", "logit_bias");
  }
}

// At most this many choices per prompt.
constexpr int64_t kMaxChoices = 64;

// logprobs / top_logprobs: a count of alternatives in [0, kMaxTopLogprobs].
std::optional<int64_t> logprob_count(const json& body, const char* name) {
  const auto count = integer_field(body, name);
  if (count && (*count < 0 || *count > kMaxTopLogprobs)) {
    throw ApiError(400, fmt::format("{} = {} is outside [0, {}]", name, *count, kMaxTopLogprobs), name);
  }
  return count;
}

GenerationRequest parse_generation(const json& body, const char* max_tokens_alias) {
  refuse_unsupported(body);
  GenerationRequest request;
  const json* model = field(body, "model");
  if (!model) throw ApiError(400, "'model' is required: the served model's name (GET /v1/models lists it)", "model");
  if (!model->is_string()) throw wrong_type("model", *model, "a string");
  request.model = model->get<std::string>();
  request.max_tokens = integer_field(body, "max_tokens");
  if (max_tokens_alias && !request.max_tokens) request.max_tokens = integer_field(body, max_tokens_alias);
  if (request.max_tokens && *request.max_tokens < 1) {
    throw ApiError(400, fmt::format("max_tokens = {} must be at least 1", *request.max_tokens), "max_tokens");
  }
  request.n = integer_field(body, "n").value_or(1);
  if (request.n < 1 || request.n > kMaxChoices) {
    throw ApiError(400, fmt::format("n = {} is outside [1, {}] (choices per prompt)", request.n, kMaxChoices), "n");
  }
  request.presence_penalty = number_field(body, "presence_penalty");
  request.frequency_penalty = number_field(body, "frequency_penalty");
  request.temperature = number_field(body, "temperature");
  request.top_p = number_field(body, "top_p");
  request.top_k = integer_field(body, "top_k");
  if (request.top_k && *request.top_k == -1) request.top_k = 0;  // vLLM's "off"
  request.repetition_penalty = number_field(body, "repetition_penalty");
  request.no_repeat_ngram_size = integer_field(body, "no_repeat_ngram_size");
  if (request.no_repeat_ngram_size && (*request.no_repeat_ngram_size < 0 || *request.no_repeat_ngram_size > 64)) {
    throw ApiError(400, fmt::format("no_repeat_ngram_size = {} is outside 0..64 (0 = off, e.g. 3)", *request.no_repeat_ngram_size),
                   "no_repeat_ngram_size");
  }
  if (auto seed = integer_field(body, "seed")) request.seed = static_cast<uint64_t>(*seed);
  request.ignore_eos = bool_field(body, "ignore_eos");
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      request.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) throw wrong_type("stop", s, "a string or a list of strings");
        request.stop.push_back(s.get<std::string>());
      }
    } else {
      throw wrong_type("stop", *stop, "a string or a list of strings");
    }
    // Every stop string is searched for after every token: a bounded set.
    if (request.stop.size() > 16) {
      throw ApiError(400, fmt::format("{} stop strings; at most 16 are allowed", request.stop.size()), "stop");
    }
    for (const auto& s : request.stop) {
      if (s.empty()) throw ApiError(400, "a stop string is empty; remove it", "stop");
      if (s.size() > 1024) throw ApiError(400, fmt::format("a stop string is {} bytes; at most 1024", s.size()), "stop");
    }
  }
  request.stream = bool_field(body, "stream").value_or(false);
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) throw wrong_type("stream_options", *options, "an object");
    request.include_usage = bool_field(*options, "include_usage").value_or(false);
  }
  return request;
}

std::vector<int64_t> token_ids(const json& array) {
  std::vector<int64_t> ids;
  for (const json& id : array) {
    if (!id.is_number_integer()) throw wrong_type("prompt", id, "a token id (integer)");
    ids.push_back(id.get<int64_t>());
  }
  if (ids.empty()) throw ApiError(400, "a token-id prompt is empty", "prompt");
  return ids;
}

}  // namespace

json error_body(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type},
            {"param", error.param ? json(*error.param) : json(nullptr)},
            {"code", error.code ? json(*error.code) : json(nullptr)}}}};
}

CompletionRequest parse_completion_request(const std::string& body) {
  const json parsed = parse_body(body);
  CompletionRequest request{.generation = parse_generation(parsed, nullptr)};
  if (const json* logprobs = field(parsed, "logprobs"); logprobs && logprobs->is_boolean()) {
    // Chat's form sent to completions: true means the drawn token alone.
    if (logprobs->get<bool>()) request.generation.logprobs = 0;
  } else {
    request.generation.logprobs = logprob_count(parsed, "logprobs");
  }
  request.generation.echo = bool_field(parsed, "echo").value_or(false);
  if (request.generation.echo && request.generation.stream) {
    throw ApiError(400, "echo with stream is not supported; stream without echo, or echo without stream", "echo");
  }
  const json* prompt = field(parsed, "prompt");
  if (!prompt) throw ApiError(400, "'prompt' is required: a string, a list of token ids, or a list of either", "prompt");
  if (prompt->is_string()) {
    request.prompts.push_back({.text = prompt->get<std::string>()});
  } else if (prompt->is_array() && !prompt->empty() && prompt->front().is_number()) {
    request.prompts.push_back({.ids = token_ids(*prompt)});
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const json& p : *prompt) {
      if (p.is_string()) request.prompts.push_back({.text = p.get<std::string>()});
      else if (p.is_array()) request.prompts.push_back({.ids = token_ids(p)});
      else throw wrong_type("prompt", p, "a string or a list of token ids");
    }
  } else if (prompt->is_array()) {
    throw ApiError(400, "'prompt' is an empty list", "prompt");
  } else {
    throw wrong_type("prompt", *prompt, "a string, a list of token ids, or a list of either");
  }
  return request;
}

ChatRequest parse_chat_request(const std::string& body) {
  const json parsed = parse_body(body);
  ChatRequest request{.generation = parse_generation(parsed, "max_completion_tokens")};
  const auto top = logprob_count(parsed, "top_logprobs");
  if (bool_field(parsed, "logprobs").value_or(false)) {
    request.generation.logprobs = top.value_or(0);
  } else if (top) {
    throw ApiError(400, "top_logprobs needs logprobs = true", "top_logprobs");
  }
  if (field(parsed, "echo")) throw ApiError(400, "'echo' is a completions option; chat has none", "echo");
  const json* messages = field(parsed, "messages");
  if (!messages) throw ApiError(400, "'messages' is required: a list of {\"role\", \"content\"} objects", "messages");
  if (!messages->is_array()) throw wrong_type("messages", *messages, "a list of messages");
  if (messages->empty()) throw ApiError(400, "'messages' is empty; give at least one message", "messages");
  request.messages = nlohmann::ordered_json::array();
  for (const json& message : *messages) {
    if (!message.is_object()) throw wrong_type("messages", message, "a list of objects");
    const json* role = field(message, "role");
    if (!role || !role->is_string()) throw ApiError(400, "each message needs a 'role' string", "messages");
    nlohmann::ordered_json out = {{"role", role->get<std::string>()}};
    const json* content = field(message, "content");
    if (!content) {
      out["content"] = "";
    } else if (content->is_string()) {
      out["content"] = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text ones, joined.
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
          throw ApiError(400, "message content parts must be {\"type\": \"text\", \"text\": ...}; this model takes text only",
                         "messages");
        }
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else {
      throw wrong_type("messages.content", *content, "a string or a list of text parts");
    }
    if (const json* name = field(message, "name"); name && name->is_string()) out["name"] = *name;
    request.messages.push_back(std::move(out));
  }
  if (const json* kwargs = field(parsed, "chat_template_kwargs")) {
    if (!kwargs->is_object()) throw wrong_type("chat_template_kwargs", *kwargs, "an object");
    request.template_kwargs = nlohmann::ordered_json::parse(kwargs->dump());
  }
  request.add_generation_prompt = bool_field(parsed, "add_generation_prompt").value_or(true);
  return request;
}

RequestOptions request_options(const GenerationRequest& request, const SamplingParams& defaults, const Limits& limits,
                               int64_t longest_prompt, uint64_t random_seed) {
  if (longest_prompt > limits.max_input_len) {
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens but this server takes at most {} (max_input_len)", longest_prompt,
                               limits.max_input_len),
                   "prompt", "invalid_request_error", "context_length_exceeded");
  }
  const int64_t room = limits.max_context > 0 ? limits.max_context - longest_prompt : limits.max_output_len;
  if (room < 1) {
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens and fills the model's context of {} positions", longest_prompt,
                               limits.max_context),
                   "prompt", "invalid_request_error", "context_length_exceeded");
  }
  RequestOptions options;
  if (request.max_tokens) {
    if (*request.max_tokens > limits.max_output_len) {
      throw ApiError(400,
                     fmt::format("max_tokens = {} is more than this server allows ({}, max_output_len)", *request.max_tokens,
                                 limits.max_output_len),
                     "max_tokens");
    }
    if (*request.max_tokens > room) {
      throw ApiError(400,
                     fmt::format("prompt ({} tokens) + max_tokens ({}) is past the model's context of {} positions",
                                 longest_prompt, *request.max_tokens, limits.max_context),
                     "max_tokens", "invalid_request_error", "context_length_exceeded");
    }
    options.max_new_tokens = *request.max_tokens;
  } else {
    options.max_new_tokens = std::min(limits.max_output_len, room);
  }
  SamplingParams sampling = defaults;
  if (request.temperature) {
    sampling.temperature = *request.temperature;
    sampling.do_sample = *request.temperature > 0;
  }
  if (request.top_p) sampling.top_p = *request.top_p;
  if (request.top_k) sampling.top_k = *request.top_k;
  if (request.repetition_penalty) sampling.repetition_penalty = *request.repetition_penalty;
  if (request.presence_penalty) sampling.presence_penalty = *request.presence_penalty;
  if (request.frequency_penalty) sampling.frequency_penalty = *request.frequency_penalty;
  sampling.seed = request.seed.value_or(sampling.greedy() ? sampling.seed : random_seed);
  try {
    sampling.validate();
  } catch (const std::exception& e) {
    throw ApiError(400, e.what());
  }
  options.sampling = sampling;
  options.no_repeat_ngram_size = request.no_repeat_ngram_size;
  options.ignore_eos = request.ignore_eos;
  options.stop = request.stop;
  options.logprobs = request.logprobs;
  if (request.echo && request.logprobs) options.prompt_logprobs = request.logprobs;
  return options;
}

namespace {

json bytes_of(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json completion_logprobs(const ChoiceResult& choice, const TokenText& token_text, int64_t initial_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  int64_t offset = initial_offset;
  auto add = [&](int64_t token, const json& logprob, const json& top) {
    const std::string text = token_text(token);
    tokens.push_back(text);
    token_logprobs.push_back(logprob);
    top_logprobs.push_back(top);
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
  };
  auto top_of = [&](const TokenLogprob& t) {
    json top = json::object();
    for (const auto& [id, logprob] : t.top) top[token_text(id)] = logprob;
    return top;
  };
  if (choice.first_prompt_token) add(*choice.first_prompt_token, nullptr, nullptr);
  for (const auto& t : choice.prompt_logprobs) add(t.token, t.logprob, top_of(t));
  for (const auto& t : choice.logprobs) add(t.token, t.logprob, top_of(t));
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

json chat_logprobs(const std::vector<TokenLogprob>& logprobs, const TokenText& token_text) {
  json content = json::array();
  for (const auto& t : logprobs) {
    const std::string text = token_text(t.token);
    json top = json::array();
    for (const auto& [id, logprob] : t.top) {
      const std::string alt = token_text(id);
      top.push_back({{"token", alt}, {"logprob", logprob}, {"bytes", bytes_of(alt)}});
    }
    content.push_back({{"token", text}, {"logprob", t.logprob}, {"bytes", bytes_of(text)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_response(const std::string& id, int64_t created, const std::string& model,
                         const std::vector<ChoiceResult>& choices, const TokenText& token_text) {
  json out = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}};
  json list = json::array();
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    list.push_back({{"index", i},
                    {"text", choices[i].text},
                    {"logprobs", choices[i].with_logprobs ? completion_logprobs(choices[i], token_text) : json(nullptr)},
                    {"finish_reason", choices[i].finish_reason}});
    if (choices[i].counts_prompt) prompt += choices[i].prompt_tokens;
    completion += choices[i].completion_tokens;
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(prompt, completion);
  return out;
}

json chat_response(const std::string& id, int64_t created, const std::string& model,
                   const std::vector<ChoiceResult>& choices, const TokenText& token_text) {
  json list = json::array();
  int64_t completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    list.push_back({{"index", i},
                    {"message", {{"role", "assistant"}, {"content", choices[i].text}}},
                    {"logprobs", choices[i].with_logprobs ? chat_logprobs(choices[i].logprobs, token_text) : json(nullptr)},
                    {"finish_reason", choices[i].finish_reason}});
    completion += choices[i].completion_tokens;
  }
  // The choices share one prompt: counted once, as OpenAI does.
  const int64_t prompt = choices.empty() ? 0 : choices.front().prompt_tokens;
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", model},
          {"choices", std::move(list)},
          {"usage", usage_json(prompt, completion)}};
}

json completion_chunk(const std::string& id, int64_t created, const std::string& model, int64_t index,
                      const std::string& text, const std::optional<std::string>& finish_reason, const json& logprobs) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices",
           json::array({{{"index", index},
                         {"text", text},
                         {"logprobs", logprobs},
                         {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}}})}};
}

json chat_chunk(const std::string& id, int64_t created, const std::string& model, int64_t index, const json& delta,
                const std::optional<std::string>& finish_reason, const json& logprobs) {
  return {{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model},
          {"choices",
           json::array({{{"index", index},
                         {"delta", delta},
                         {"logprobs", logprobs},
                         {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}}})}};
}

std::string dump_json(const json& object) { return object.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& object) { return "data: " + dump_json(object) + "\n\n"; }

}  // namespace colossus::inference::serving
