// The OpenAI wire format, without HTTP: request bodies of /v1/completions and
// /v1/chat/completions parsed and checked (every refusal an ApiError naming
// the field, as OpenAI's {"error": {...}} body), and the response and SSE
// chunk objects built from engine outputs.
#pragma once
#include "colossus/inference/engine/sequence.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace colossus::inference::serving {

// A refused request: HTTP status and OpenAI's error fields.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::optional<std::string> param = {},
           std::string type = "invalid_request_error", std::optional<std::string> code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;
  std::optional<std::string> param;
  std::optional<std::string> code;
};

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const ApiError& error);

// The fields both endpoints share. Unset sampling fields take the server's
// defaults (InferenceConfig); a request temperature of 0 means greedy.
struct GenerationRequest {
  std::string model;
  std::optional<int64_t> max_tokens{};
  std::optional<double> temperature{};
  std::optional<double> top_p{};
  std::optional<int64_t> top_k{};
  std::optional<double> repetition_penalty{};
  std::optional<int64_t> no_repeat_ngram_size{};
  std::optional<uint64_t> seed{};
  std::optional<bool> ignore_eos{};
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int64_t n = 1;               // choices per prompt (each sampled with its own seed)
  std::optional<double> presence_penalty{};
  std::optional<double> frequency_penalty{};
  // Set: each generated token's logprob with this many alternatives
  // (completions' logprobs; chat's top_logprobs when logprobs is true).
  std::optional<int64_t> logprobs{};
  bool echo = false;  // completions: the prompt is returned before the completion (with its logprobs)
};

// A prompt as the client sent it: text, or token ids.
struct Prompt {
  std::optional<std::string> text;
  std::vector<int64_t> ids;
};

struct CompletionRequest {
  GenerationRequest generation;
  std::vector<Prompt> prompts;  // one choice each
};

struct ChatRequest {
  GenerationRequest generation;
  nlohmann::ordered_json messages;  // [{role, content: string}, ...], content parts flattened to text
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  bool add_generation_prompt = true;
};

// Throw ApiError(400) for malformed JSON, missing or mistyped fields, values
// out of range and the OpenAI options this server does not implement
// (suffix, tools, logit_bias, ...).
CompletionRequest parse_completion_request(const std::string& body);
ChatRequest parse_chat_request(const std::string& body);

// The engine's options for a request. max_tokens unset = as many as fit
// (max_output_len, and the model's context past the longest prompt).
// Throws ApiError(400) for max_tokens past max_output_len or the context.
// random_seed: the seed of a sampled request that brought none.
struct Limits {
  int64_t max_input_len = 0;
  int64_t max_output_len = 0;
  int64_t max_context = 0;  // positions the model has (0 = unbounded)
};
RequestOptions request_options(const GenerationRequest& request, const SamplingParams& defaults, const Limits& limits,
                               int64_t longest_prompt, uint64_t random_seed);

// Response objects. `created` in Unix seconds.
struct ChoiceResult {
  std::string text;  // with echo, the prompt's text first
  std::string finish_reason;  // "stop", "length", "abort"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  bool counts_prompt = true;   // false for a prompt's 2nd..nth choice: usage counts a prompt once
  bool with_logprobs = false;  // the request asked for logprobs
  // echo with logprobs: the prompt's first token (no logprob) and the rest's.
  std::optional<int64_t> first_prompt_token{};
  std::vector<TokenLogprob> prompt_logprobs;
  std::vector<TokenLogprob> logprobs;  // the generated tokens'
};
// A token id as text (its decoded bytes, invalid UTF-8 replaced on output).
using TokenText = std::function<std::string(int64_t)>;
// The completions API's logprobs object: {"tokens", "token_logprobs",
// "top_logprobs", "text_offset"}, the prompt's entries first with echo (its
// first token's logprob null); offsets count from `initial_offset`.
nlohmann::json completion_logprobs(const ChoiceResult& choice, const TokenText& token_text, int64_t initial_offset = 0);
// The chat API's logprobs object: {"content": [{"token", "logprob", "bytes",
// "top_logprobs": [...]}]}.
nlohmann::json chat_logprobs(const std::vector<TokenLogprob>& logprobs, const TokenText& token_text);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
nlohmann::json completion_response(const std::string& id, int64_t created, const std::string& model,
                                   const std::vector<ChoiceResult>& choices, const TokenText& token_text);
nlohmann::json chat_response(const std::string& id, int64_t created, const std::string& model,
                             const std::vector<ChoiceResult>& choices, const TokenText& token_text);
// One SSE chunk's object: text (completions) or delta content (chat) of
// choice `index`, with finish_reason null until the last chunk of a choice
// and logprobs null unless given.
nlohmann::json completion_chunk(const std::string& id, int64_t created, const std::string& model, int64_t index,
                                const std::string& text, const std::optional<std::string>& finish_reason,
                                const nlohmann::json& logprobs = nullptr);
nlohmann::json chat_chunk(const std::string& id, int64_t created, const std::string& model, int64_t index,
                          const nlohmann::json& delta, const std::optional<std::string>& finish_reason,
                          const nlohmann::json& logprobs = nullptr);
// "data: <json>\n\n" (invalid UTF-8 replaced, so a stream never fails mid-way).
std::string sse_event(const nlohmann::json& object);
std::string dump_json(const nlohmann::json& object);

}  // namespace colossus::inference::serving
