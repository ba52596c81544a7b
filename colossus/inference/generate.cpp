#include "colossus/inference/generate.h"

#include "colossus/core/errors.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <variant>

namespace colossus::inference {

void GenerateOptions::validate() const {
  if (max_new_tokens < 0) {
    throw ConfigError(fmt::format("max_new_tokens = {} is invalid; expected >= 0, e.g. 100", max_new_tokens));
  }
  sampling.validate();
  if (!stop_strings.empty() && tokenizer == nullptr) {
    throw ConfigError("stop_strings need a tokenizer to decode the generated text; set GenerateOptions.tokenizer");
  }
  for (const auto& stop : stop_strings) {
    if (stop.empty()) throw ConfigError("an empty stop string would stop at once; give non-empty stop strings");
  }
}

std::optional<int64_t> max_context(const models::CausalLM& model) {
  if (const auto* gpt2 = std::get_if<models::GPT2Config>(&model.config())) return gpt2->n_positions;
  return std::nullopt;
}

at::Tensor next_token_logits(models::CausalLM& model, const std::vector<int64_t>& ids) {
  const auto length = static_cast<int64_t>(ids.size());
  const at::Tensor input = at::tensor(ids, at::kLong).view({1, length}).to(model.embedding().weight.device());
  at::Tensor hidden = model.embed(input);
  const models::BlockContext context = model.block_context(hidden);
  hidden = model.forward_blocks(hidden, context, 0, model.blocks().size());
  // The norm is per position and only the last position's logits are used, so
  // the (T, V) head product shrinks to (1, V).
  hidden = model.final_norm(hidden.narrow(1, length - 1, 1));
  return model.head(hidden).reshape({-1});
}

namespace {

// Puts the model in eval mode (no dropout) for its lifetime and restores
// training mode afterwards if it was on.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(models::CausalLM& model) : model_(model), was_training_(model.is_training()) { model_.eval(); }
  ~EvalModeGuard() {
    if (was_training_) model_.train();
  }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  models::CausalLM& model_;
  bool was_training_;
};

// Whether the text generated so far contains a stop string that the newest
// token completed: only the tail it could have touched is searched.
bool hits_stop_string(const std::string& text, size_t text_before, const std::vector<std::string>& stops) {
  for (const auto& stop : stops) {
    const size_t from = text_before >= stop.size() ? text_before - stop.size() + 1 : 0;
    if (text.find(stop, from) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::vector<int64_t> generate(models::CausalLM& model, std::vector<int64_t> prompt, const GenerateOptions& options,
                              at::Generator& generator) {
  options.validate();
  if (prompt.empty()) {
    throw ConfigError("the prompt has no tokens; give at least one (e.g. the tokenizer's bos or eos id)");
  }
  const int64_t vocab = models::vocab_size(model.config());
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      throw ConfigError(fmt::format("prompt token {} is outside the model's vocabulary [0, {})", id, vocab));
    }
  }
  at::NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const std::optional<int64_t> window = max_context(model);
  std::vector<int64_t> ids = std::move(prompt);
  std::vector<int32_t> generated;  // for decoding stop strings
  std::string generated_text;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const bool clipped = window && static_cast<int64_t>(ids.size()) > *window;
    const at::Tensor logits = clipped ? next_token_logits(model, std::vector<int64_t>(ids.end() - *window, ids.end()))
                                      : next_token_logits(model, ids);
    const int64_t token = sample_next(logits, ids, options.sampling, generator);
    ids.push_back(token);
    if (options.on_token) options.on_token(token);
    if (options.eos_id && token == *options.eos_id) break;
    if (!options.stop_strings.empty()) {
      generated.push_back(static_cast<int32_t>(token));
      const size_t before = generated_text.size();
      generated_text = options.tokenizer->decode(generated);
      if (hits_stop_string(generated_text, std::min(before, generated_text.size()), options.stop_strings)) break;
    }
  }
  return ids;
}

std::vector<int64_t> generate(models::CausalLM& model, std::vector<int64_t> prompt, const GenerateOptions& options) {
  at::Generator generator = make_cpu_generator(options.sampling.seed);
  return generate(model, std::move(prompt), options, generator);
}

}  // namespace colossus::inference
