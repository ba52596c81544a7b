// Autoregressive generation for one prompt: the quick sampling path until the
// inference engine with a paged KV cache exists. There is NO KV cache: every
// step recomputes the forward over the whole context, so a step costs
// O(context) and a sequence O(length^2). Fine for demos and tests; not for serving.
#pragma once
#include "colossus/data/tokenizer.h"
#include "colossus/inference/sampler.h"
#include "colossus/models/causal_lm.h"

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace colossus::inference {

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  SamplingParams sampling{};
  // Generation ends after this token (it is kept in the output, as in HF).
  std::optional<int64_t> eos_id{};
  // Generation ends once the generated text contains one of these (kept in
  // the output, as HF's stop_strings). Needs `tokenizer` to decode.
  std::vector<std::string> stop_strings{};
  const data::Tokenizer* tokenizer = nullptr;
  // Called with each new token as soon as it is chosen (streaming output).
  std::function<void(int64_t token)> on_token{};

  // Throws ConfigError naming the bad value (sampling params included).
  void validate() const;
};

// Returns the prompt followed by up to max_new_tokens generated ids (as HF's
// generate). prompt: ids in [0, vocab), at least one. Runs under NoGradGuard
// in eval mode (restored after) on the model's device and dtype. GPT-2 sees
// only the last n_positions tokens of the context (its learned positions end
// there); LLaMA sees all of it. The repetition penalty looks at the whole
// sequence, prompt included. Sampling draws from `generator` (a CPU generator
// gives the same tokens on any device).
std::vector<int64_t> generate(models::CausalLM& model, std::vector<int64_t> prompt, const GenerateOptions& options,
                              at::Generator& generator);

// As above with a CPU generator seeded from options.sampling.seed.
std::vector<int64_t> generate(models::CausalLM& model, std::vector<int64_t> prompt, const GenerateOptions& options);

// The logits of the token after `ids` (one forward over all of them, the head
// over the last position only): (V) in the model's dtype, on its device.
at::Tensor next_token_logits(models::CausalLM& model, const std::vector<int64_t>& ids);

// How many trailing tokens of a context the model can attend to: GPT-2's
// n_positions, or nullopt (no limit) for RoPE models.
std::optional<int64_t> max_context(const models::CausalLM& model);

}  // namespace colossus::inference
