// Admission: a request's prompt and options checked against the model, the
// config and the KV pool, before it is queued; and aborting one.
#include "colossus/inference/engine/engine.h"

#include "colossus/core/errors.h"
#include "colossus/inference/engine/speculative.h"
#include "colossus/inference/engine/text_state.h"

#include <fmt/format.h>

#include <algorithm>

namespace colossus::inference {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t InferenceEngine::add_request(const std::string& prompt, const RequestOptions& options) {
  if (!tokenizer_) throw ConfigError("a text prompt needs a tokenizer; this engine has none (pass token ids)");
  std::vector<int32_t> ids = tokenizer_->encode(prompt, /*add_special_tokens=*/true);
  return add_request(std::vector<int64_t>(ids.begin(), ids.end()), options);
}

int64_t InferenceEngine::add_request(std::vector<int64_t> prompt, const RequestOptions& options) {
  const int64_t vocab = models::vocab_size(model_->config());
  if (prompt.empty()) throw ConfigError("the prompt is empty; a request needs at least one token");
  if (static_cast<int64_t>(prompt.size()) > config_.max_input_len) {
    throw ConfigError(fmt::format("the prompt has {} tokens but max_input_len is {}", prompt.size(), config_.max_input_len));
  }
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) throw ConfigError(fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, vocab));
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->request_id = seq->id;
  seq->prompt_len = static_cast<int64_t>(prompt.size());
  seq->tokens = std::move(prompt);
  seq->max_new_tokens = options.max_new_tokens.value_or(config_.max_output_len);
  if (seq->max_new_tokens < 1 || seq->max_new_tokens > config_.max_output_len) {
    throw ConfigError(fmt::format("max_new_tokens is {}; it must be in [1, {}] (max_output_len)", seq->max_new_tokens,
                                  config_.max_output_len));
  }
  // longrope (Phi-3) rotates a whole sequence by long_factor once it is longer
  // than original_max_position_embeddings (transformers recomputes its cache
  // then); the engine's cached keys keep the short set, so such a request is refused.
  if (const auto* llama = std::get_if<models::LlamaConfig>(&model_->config());
      llama != nullptr && llama->rope_scaling.rope_type == "longrope") {
    const int64_t original =
        llama->rope_scaling.original_max_position_embeddings.value_or(llama->max_position_embeddings);
    if (seq->prompt_len + seq->max_new_tokens > original) {
      throw ConfigError(fmt::format("the prompt ({} tokens) plus max_new_tokens ({}) exceeds the longrope model's "
                                    "original_max_position_embeddings ({}), past which the engine does not switch RoPE "
                                    "to long_factor; use generate() (full recompute) or a shorter request",
                                    seq->prompt_len, seq->max_new_tokens, original));
    }
  }
  seq->sampling = options.sampling.value_or(config_.default_sampling());
  seq->sampling.validate();
  seq->no_repeat_ngram_size = options.no_repeat_ngram_size.value_or(config_.no_repeat_ngram_size);
  if (seq->no_repeat_ngram_size < 0) {
    throw ConfigError(fmt::format("no_repeat_ngram_size is {}; use 0 (off) or a positive n", seq->no_repeat_ngram_size));
  }
  if (!options.ignore_eos.value_or(config_.ignore_eos)) {
    if (config_.eos_token_id) seq->eos_id = config_.eos_token_id;
    else if (tokenizer_ && tokenizer_->eos_id()) seq->eos_id = *tokenizer_->eos_id();
  }
  const int64_t width = options.beam_width.value_or(config_.beam_width);
  if (width > 1) {
    if (width > config_.max_batch_size || 2 * width > vocab) {
      throw ConfigError(fmt::format("beam_width {} needs width <= max_batch_size ({}) and 2 x width <= the vocabulary ({})",
                                    width, config_.max_batch_size, vocab));
    }
    if (!seq->sampling.greedy() || seq->sampling.repetition_penalty != 1.0 || seq->sampling.output_penalties() ||
        seq->no_repeat_ngram_size > 0 ||
        !options.stop.empty() || config_.enable_streamingllm || config_.forced_eos_token_id) {
      throw ConfigError(fmt::format("beam search (beam_width {}) is deterministic and scores whole sequences: it does not "
                                    "combine with sampling, repetition/presence/frequency penalties, no_repeat_ngram_size, stop strings, "
                                    "forced_eos_token_id or StreamingLLM",
                                    width));
    }
    seq->beam = std::make_shared<BeamSearch>(width, seq->max_new_tokens, seq->eos_id, config_.length_penalty,
                                             config_.early_stopping);
  } else if (width < 1) {
    throw ConfigError(fmt::format("beam_width is {}; use 1 (off) or more beams", width));
  }
  for (const auto& [value, name] : {std::pair{options.logprobs, "logprobs"}, {options.prompt_logprobs, "prompt_logprobs"}}) {
    if (value && (*value < 0 || *value > kMaxTopLogprobs)) {
      throw ConfigError(fmt::format("{} = {}: the number of alternatives per token must be in [0, {}]", name, *value,
                                    kMaxTopLogprobs));
    }
  }
  if (seq->sampling.output_penalties() && drafter_) {
    throw ConfigError("presence_penalty / frequency_penalty are not applied to speculative decoding's drafts; set them "
                      "to 0, or serve without a drafter");
  }
  if ((options.logprobs || options.prompt_logprobs) && (width > 1 || drafter_)) {
    throw ConfigError("logprobs are not reported under beam search or speculative decoding; leave logprobs out, or "
                      "use beam_width = 1 without a drafter");
  }
  seq->logprobs = options.logprobs.value_or(-1);
  seq->prompt_logprobs = options.prompt_logprobs.value_or(-1);
  seq->stop = options.stop;
  if (!seq->stop.empty() && !tokenizer_) throw ConfigError("stop strings need a tokenizer; this engine has none");
  for (const auto& s : seq->stop) {
    if (s.empty()) throw ConfigError("a stop string is empty; remove it or give at least one character");
  }
  const int64_t total = seq->prompt_len + seq->max_new_tokens;
  if (const auto* gpt2 = std::get_if<models::GPT2Config>(&model_->config()); gpt2 && total > gpt2->n_positions) {
    throw ConfigError(fmt::format("prompt ({} tokens) + max_new_tokens ({}) is {}, past the model's n_positions {}",
                                  seq->prompt_len, seq->max_new_tokens, total, gpt2->n_positions));
  }
  const int64_t bs = cache_->block_size();
  // StreamingLLM and a sliding window on every layer keep a bounded tail of
  // the cache (plus a step's tokens under a window: its chunk and block slack).
  const int64_t most_cached =
      config_.enable_streamingllm ? std::min(total, config_.start_token_size + config_.generated_token_size + 2 * bs)
      : kv_window_ > 0            ? std::min(total, kv_window_ + config_.token_budget() + 2 * bs)
                                  : total;
  const int64_t blocks_needed = (ceil_div(most_cached, bs) + 1) * width;
  if (blocks_needed > cache_->allocator().num_blocks()) {
    throw ConfigError(fmt::format("a request of {} tokens{} needs {} KV blocks of {} tokens but the pool has {}; "
                                  "shorten it, or give the cache more blocks (num_blocks)",
                                  total, width > 1 ? fmt::format(" with {} beams", width) : "", blocks_needed, bs,
                                  cache_->allocator().num_blocks()));
  }
  seq->generator = make_cpu_generator(seq->sampling.seed);
  if (tokenizer_) {
    auto text = std::make_unique<TextState>(*tokenizer_);
    for (const auto& s : seq->stop) text->holdback = std::max(text->holdback, s.size() - 1);
    texts_[seq->id] = std::move(text);
  }
  const int64_t id = seq->id;
  scheduler_->add(std::move(seq));
  return id;
}

void InferenceEngine::abort_request(int64_t id) {
  std::unique_ptr<Sequence> seq = scheduler_->remove(id);
  if (!seq) return;
  texts_.erase(id);
  if (drafter_) drafter_->release(id);
  aborted_.push_back({.request_id = id, .finished = true, .finish_reason = FinishReason::Abort,
                      .prompt_tokens = seq->prompt_len, .generated_tokens = seq->num_generated()});
}

}  // namespace colossus::inference
