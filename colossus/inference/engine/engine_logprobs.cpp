// Log-probabilities for OpenAI's logprobs / top_logprobs / echo: of each
// drawn token from its step's logits, and of a prompt's tokens from the
// hidden states of its prefill chunks (logits computed only for those rows).
#include "colossus/inference/engine/engine.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace colossus::inference {

std::vector<TokenLogprob> token_logprobs(const at::Tensor& logits, const std::vector<int64_t>& tokens,
                                         const std::vector<int64_t>& top) {
  std::vector<TokenLogprob> out(tokens.size());
  if (tokens.empty()) return out;
  const at::Tensor logp = at::log_softmax(logits.to(at::kFloat), -1);
  const at::Tensor index = at::tensor(tokens, at::kLong).to(logp.device()).unsqueeze(1);
  const at::Tensor chosen = logp.gather(1, index).squeeze(1).to(at::kDouble).cpu();
  const int64_t k = std::min(*std::max_element(top.begin(), top.end()), logp.size(1));
  at::Tensor top_values, top_ids;
  if (k > 0) {
    auto [values, ids] = logp.topk(k, -1);
    top_values = values.to(at::kDouble).cpu();
    top_ids = ids.cpu();
  }
  const auto chosen_at = chosen.accessor<double, 1>();
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[i].token = tokens[i];
    out[i].logprob = chosen_at[static_cast<int64_t>(i)];
    if (k == 0) continue;
    const auto ids_at = top_ids.accessor<int64_t, 2>();
    const auto values_at = top_values.accessor<double, 2>();
    for (int64_t j = 0; j < std::min(top[i], k); ++j) {
      out[i].top.emplace_back(ids_at[static_cast<int64_t>(i)][j], values_at[static_cast<int64_t>(i)][j]);
    }
  }
  return out;
}

void InferenceEngine::collect_prompt_logprobs(const std::vector<ScheduledSequence>& batch) {
  std::vector<int64_t> rows, targets, top;
  std::vector<Sequence*> owners;
  int64_t offset = 0;  // the item's first row in the packed batch
  for (const ScheduledSequence& item : batch) {
    Sequence& seq = *item.seq;
    // Row r of this chunk (position num_computed + r) predicts the token after it.
    for (int64_t r = 0; seq.prompt_logprobs >= 0 && r < item.num_tokens; ++r) {
      const int64_t target = seq.num_computed + r + 1;
      if (target >= seq.prompt_len) break;
      if (target < seq.prompt_logprobs_next) continue;  // reported before a preemption
      rows.push_back(offset + r);
      targets.push_back(seq.tokens[static_cast<size_t>(target)]);
      top.push_back(seq.prompt_logprobs);
      owners.push_back(&seq);
    }
    offset += item.num_tokens;
  }
  if (rows.empty()) return;
  auto logprobs = token_logprobs(drawable(runner_->logits_at(rows)), targets, top);
  for (size_t i = 0; i < owners.size(); ++i) {
    owners[i]->pending_prompt_logprobs.push_back(std::move(logprobs[i]));
    ++owners[i]->prompt_logprobs_next;
  }
}

at::Tensor InferenceEngine::drawable(const at::Tensor& logits) const {
  if (tokenizer_ && tokenizer_->vocab_size() < logits.size(-1)) return logits.narrow(-1, 0, tokenizer_->vocab_size());
  return logits;
}

}  // namespace colossus::inference
