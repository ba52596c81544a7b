// Choosing the next token from a model's logits: greedy or seeded sampling
// after Hugging Face's logits processors, with HF's semantics and order
// (repetition penalty, then temperature, top-k, top-p), so a seeded CPU run
// draws the same tokens as transformers' generate() under torch.manual_seed.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace colossus::inference {

struct SamplingParams {
  bool do_sample = true;            // false: greedy (argmax after the repetition penalty)
  double temperature = 1.0;         // 0 also means greedy; otherwise logits are divided by it
  int64_t top_k = 0;                // keep the k most likely tokens (ties at the k-th kept); 0 = off
  double top_p = 1.0;               // keep the smallest set with probability >= top_p; 1 = off
  double repetition_penalty = 1.0;  // > 1 discourages tokens already in the context; 1 = off
  uint64_t seed = 0;                // for the generator that generate() makes
  // OpenAI's penalties on the tokens generated so far (the engine applies
  // them before the processors above; the prompt is not counted): the logit
  // of a token seen c times drops by frequency_penalty * c + presence_penalty
  // * (c > 0). In [-2, 2]; 0 = off.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;

  // Throws ConfigError naming the bad value and its valid range.
  void validate() const;
  bool greedy() const { return !do_sample || temperature == 0.0; }
  bool output_penalties() const { return presence_penalty != 0.0 || frequency_penalty != 0.0; }
};

// The processors of `params` applied to logits (B, V) in float32, as HF's
// RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper
// and TopPLogitsWarper (min_tokens_to_keep = 1) do: removed tokens are -inf.
// contexts: B token lists for the repetition penalty (prompt and generated so
// far; duplicates count once), or empty when there is no context. Greedy
// params apply only the penalty: the warpers never change the argmax.
// Returns (B, V) float32 on logits' device.
at::Tensor process_logits(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& contexts,
                          const SamplingParams& params);

// The next token of each row. logits: (B, V), any float dtype and device;
// contexts as in process_logits. Sampling draws from `generator` with
// torch.multinomial; the logits go to the generator's device first, so a CPU
// generator gives the same tokens whatever device the model ran on.
// Returns (B) int64 on the generator's device (greedy: on logits' device).
at::Tensor sample_next_batch(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& contexts,
                             const SamplingParams& params, at::Generator& generator);

// One sequence: logits (V) -> the next token id.
int64_t sample_next(const at::Tensor& logits, const std::vector<int64_t>& context, const SamplingParams& params,
                    at::Generator& generator);

// A CPU generator in the state torch.manual_seed(seed) leaves torch's default one.
at::Generator make_cpu_generator(uint64_t seed);

}  // namespace colossus::inference
