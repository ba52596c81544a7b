#include "colossus/inference/sampler.h"

#include "colossus/core/errors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <c10/util/StringUtil.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace colossus::inference {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0) {
    throw ConfigError(fmt::format(
        "temperature = {} is invalid; expected a finite value >= 0 (0 = greedy, 1 = unchanged)", temperature));
  }
  if (top_k < 0) throw ConfigError(fmt::format("top_k = {} is invalid; expected >= 0 (0 = off), e.g. 50", top_k));
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    throw ConfigError(fmt::format("top_p = {} is outside (0, 1]; expected e.g. 0.9 (1 = off)", top_p));
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0) {
    throw ConfigError(fmt::format("repetition_penalty = {} is invalid; expected a finite value > 0 (1 = off, e.g. 1.2)",
                                  repetition_penalty));
  }
  for (const auto& [value, name] : {std::pair{presence_penalty, "presence_penalty"}, {frequency_penalty, "frequency_penalty"}}) {
    if (!(value >= -2.0 && value <= 2.0)) {
      throw ConfigError(fmt::format("{} = {} is outside [-2, 2] (0 = off, > 0 discourages repeats, e.g. 0.5)", name, value));
    }
  }
}

namespace {

// HF's RepetitionPenaltyLogitsProcessor on one row: every token of the
// context has its logit divided by the penalty if positive, multiplied if
// negative. A token repeated in the context is penalised once (HF's
// gather/scatter writes the same value for each repeat).
void apply_repetition_penalty(at::Tensor row /*(V) float32*/, std::vector<int64_t> context, double penalty) {
  std::sort(context.begin(), context.end());
  context.erase(std::unique(context.begin(), context.end()), context.end());
  if (context.empty()) return;
  const int64_t vocab = row.size(0);
  if (context.front() < 0 || context.back() >= vocab) {
    throw ConfigError(fmt::format("context token {} is outside the vocabulary [0, {})",
                                  context.front() < 0 ? context.front() : context.back(), vocab));
  }
  const at::Tensor index = at::tensor(context, at::kLong).to(row.device());
  const at::Tensor picked = row.index_select(0, index);
  row.index_copy_(0, index, at::where(picked < 0, picked * penalty, picked / penalty));
}

}  // namespace

at::Tensor process_logits(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& contexts,
                          const SamplingParams& params) {
  params.validate();
  if (logits.dim() != 2 || logits.size(1) < 1) {
    throw ConfigError(fmt::format("logits must be (B, V) with V >= 1; got shape {}", c10::str(logits.sizes())));
  }
  const int64_t batch = logits.size(0);
  const int64_t vocab = logits.size(1);
  if (!contexts.empty() && static_cast<int64_t>(contexts.size()) != batch) {
    throw ConfigError(
        fmt::format("{} contexts for {} rows of logits; expected one per row, or none", contexts.size(), batch));
  }
  // HF takes the scores in float32 whatever the model's dtype; a copy, as the
  // penalty writes in place.
  at::Tensor scores = logits.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  if (params.repetition_penalty != 1.0) {
    for (int64_t b = 0; b < static_cast<int64_t>(contexts.size()); ++b) {
      apply_repetition_penalty(scores.select(0, b), contexts[b], params.repetition_penalty);
    }
  }
  if (params.greedy()) return scores;

  constexpr float kRemoved = -std::numeric_limits<float>::infinity();
  if (params.temperature != 1.0) scores = scores / params.temperature;
  if (params.top_k != 0) {
    const int64_t k = std::min(std::max<int64_t>(params.top_k, 1), vocab);
    // Everything below the k-th largest goes; ties with it stay, as in HF.
    const at::Tensor kth = std::get<0>(at::topk(scores, k, /*dim=*/-1)).narrow(-1, k - 1, 1);
    scores = scores.masked_fill(scores < kth, kRemoved);
  }
  if (params.top_p < 1.0) {
    // HF's formulation: sort ascending and drop the tokens whose cumulative
    // probability from the bottom stays <= 1 - top_p; the most likely token
    // always survives (min_tokens_to_keep = 1).
    auto [sorted, order] = at::sort(scores, /*stable=*/true, /*dim=*/-1, /*descending=*/false);
    at::Tensor sorted_remove = at::softmax(sorted, -1).cumsum(-1) <= (1.0 - params.top_p);
    sorted_remove.narrow(-1, vocab - 1, 1).fill_(false);
    const at::Tensor remove = sorted_remove.scatter(-1, order, sorted_remove);
    scores = scores.masked_fill(remove, kRemoved);
  }
  return scores;
}

at::Tensor sample_next_batch(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& contexts,
                             const SamplingParams& params, at::Generator& generator) {
  if (params.greedy()) return at::argmax(process_logits(logits, contexts, params), -1);
  const c10::Device device = generator.device();
  const at::Tensor scores = process_logits(logits.to(device), contexts, params);
  const at::Tensor probs = at::softmax(scores, -1);
  return at::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(1);
}

int64_t sample_next(const at::Tensor& logits, const std::vector<int64_t>& context, const SamplingParams& params,
                    at::Generator& generator) {
  if (logits.dim() != 1) throw ConfigError(fmt::format("logits must be (V); got shape {}", c10::str(logits.sizes())));
  return sample_next_batch(logits.unsqueeze(0), {context}, params, generator).item<int64_t>();
}

at::Generator make_cpu_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

}  // namespace colossus::inference
