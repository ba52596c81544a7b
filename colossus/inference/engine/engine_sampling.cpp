// Sampling dispatch: one argmax copy for a plain-greedy batch, else each
// row through its request's processors and sampler.
#include "colossus/inference/engine/engine.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace colossus::inference {

void ban_repeated_ngrams(at::Tensor& logits, const std::vector<int64_t>& tokens, int64_t n) {
  const auto len = static_cast<int64_t>(tokens.size());
  if (n < 1 || len + 1 < n) return;
  std::set<int64_t> banned;
  // Every earlier n-gram whose first n-1 tokens equal the last n-1 tokens.
  for (int64_t start = 0; start + n <= len; ++start) {
    if (std::equal(tokens.begin() + start, tokens.begin() + start + n - 1, tokens.end() - (n - 1))) {
      banned.insert(tokens[static_cast<size_t>(start + n - 1)]);
    }
  }
  for (int64_t t : banned) logits[t] = -std::numeric_limits<float>::infinity();
}

void apply_output_penalties(at::Tensor& logits, const Sequence& seq) {
  if (!seq.sampling.output_penalties()) return;
  std::map<int64_t, int64_t> counts;
  for (int64_t i = seq.prompt_len; i < seq.num_tokens(); ++i) ++counts[seq.tokens[static_cast<size_t>(i)]];
  auto* row = logits.data_ptr<float>();
  for (const auto& [token, count] : counts) {
    row[token] -= static_cast<float>(seq.sampling.frequency_penalty * static_cast<double>(count) +
                                     seq.sampling.presence_penalty);
  }
}

std::vector<int64_t> InferenceEngine::draw_tokens(const std::vector<Sequence*>& seqs, const at::Tensor& logits) {
  const bool plain_greedy = std::all_of(seqs.begin(), seqs.end(), [](const Sequence* s) {
    return s->sampling.greedy() && s->sampling.repetition_penalty == 1.0 && s->no_repeat_ngram_size == 0 &&
           !s->sampling.output_penalties();
  });
  std::vector<int64_t> tokens;
  if (plain_greedy) {
    at::Tensor best = logits.argmax(-1).cpu();  // the step's one device-to-host copy
    tokens.assign(best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + best.numel());
  } else {
    at::Tensor rows = logits.to(at::kFloat).cpu();
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& seq = *seqs[i];
      at::Tensor row = rows[static_cast<int64_t>(i)].clone();
      ban_repeated_ngrams(row, seq.tokens, seq.no_repeat_ngram_size);
      apply_output_penalties(row, seq);
      tokens.push_back(sample_next(row, seq.tokens, seq.sampling, seq.generator));
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    // HF's ForcedEOSTokenLogitsProcessor: the last allowed token is eos.
    if (config_.forced_eos_token_id && seqs[i]->num_generated() + 1 == seqs[i]->max_new_tokens) {
      tokens[i] = *config_.forced_eos_token_id;
    }
  }
  return tokens;
}

}  // namespace colossus::inference
