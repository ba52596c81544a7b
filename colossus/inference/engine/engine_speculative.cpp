// Speculative decoding in the engine: drafts added to decode steps, then
// verified against the target's logits (greedy: kept while they are its
// argmax; sampled: rejection sampling), the KV past the accepted ones dropped.
#include "colossus/inference/engine/engine.h"

#include "colossus/core/errors.h"
#include "colossus/inference/engine/speculative.h"

#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <fmt/format.h>

#include <algorithm>

namespace colossus::inference {

void InferenceEngine::enable_spec_dec(std::shared_ptr<models::CausalLM> drafter, int64_t n_spec_tokens) {
  TORCH_CHECK(drafter != nullptr, "enable_spec_dec needs a drafter model");
  const int64_t n = n_spec_tokens > 0 ? n_spec_tokens : config_.max_n_spec_tokens;
  if (n < 1) throw ConfigError(fmt::format("n_spec_tokens is {}; a drafter must propose at least 1 token", n));
  const int64_t vocab = models::vocab_size(model_->config()), drafter_vocab = models::vocab_size(drafter->config());
  if (vocab != drafter_vocab) {
    throw ConfigError(fmt::format("the drafter's vocabulary ({} tokens) differs from the model's ({}); speculative "
                                  "decoding needs the same tokenizer",
                                  drafter_vocab, vocab));
  }
  const at::Tensor ours = model_->parameters().front(), theirs = drafter->parameters().front();
  if (ours.device() != theirs.device()) {
    throw ConfigError(fmt::format("the drafter is on {} but the model on {}; put both on one device",
                                  theirs.device().str(), ours.device().str()));
  }
  if (config_.enable_streamingllm) throw ConfigError("speculative decoding does not combine with StreamingLLM");
  if (config_.forced_eos_token_id) throw ConfigError("speculative decoding does not combine with forced_eos_token_id");
  drafter_ = std::make_unique<Drafter>(std::move(drafter), cache_->shape().num_blocks, cache_->block_size());
  n_spec_tokens_ = n;
  config_.use_spec_dec = true;
  config_.max_n_spec_tokens = n;
}

void InferenceEngine::disable_spec_dec() {
  drafter_.reset();
  config_.use_spec_dec = false;
}

void InferenceEngine::add_drafts(std::vector<ScheduledSequence>& batch) {
  std::vector<ScheduledSequence*> items;
  std::vector<Sequence*> seqs;
  std::vector<int64_t> k;
  for (ScheduledSequence& item : batch) {
    Sequence& seq = *item.seq;
    // Decode steps only: one new token, past the prompt, not a beam.
    if (!item.sample || item.num_tokens != 1 || seq.beam || seq.num_generated() < 1) continue;
    // Drafts never take the last allowed token: the target draws that one.
    const int64_t room = seq.max_new_tokens - seq.num_generated() - 1;
    if (room < 1) continue;
    items.push_back(&item);
    seqs.push_back(&seq);
    k.push_back(std::min(n_spec_tokens_, room));
  }
  if (seqs.empty()) return;
  std::vector<Drafter::Proposal> proposals = drafter_->propose(seqs, k);
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& seq = *seqs[i];
    const auto m = static_cast<int64_t>(proposals[i].tokens.size());
    if (m == 0 || !cache_->reserve(seq, 1 + m)) {
      drafter_->rollback(seq, seq.num_computed);
      continue;
    }
    seq.tokens.insert(seq.tokens.end(), proposals[i].tokens.begin(), proposals[i].tokens.end());
    items[i]->num_tokens = 1 + m;
    items[i]->num_drafts = m;
    draft_probs_[seq.id] = std::move(proposals[i].probs);
  }
}

void InferenceEngine::verify_drafts(const ScheduledSequence& item, const at::Tensor& logits,
                                    std::vector<RequestOutput>& outputs) {
  Sequence& seq = *item.seq;
  const int64_t m = item.num_drafts;
  const int64_t base = seq.num_tokens() - m;  // tokens before the drafts
  const std::vector<int64_t> drafts(seq.tokens.end() - m, seq.tokens.end());
  at::Tensor rows = logits.to(at::kFloat).cpu();
  SpecVerdict verdict;
  if (seq.sampling.greedy()) {
    // Keep a draft exactly when it is what plain greedy decoding draws there.
    verdict.accepted = m;
    for (int64_t j = 0; j <= m; ++j) {
      const std::vector<int64_t> context(seq.tokens.begin(), seq.tokens.begin() + base + j);
      const int64_t best = processed_logits(rows[j], context, seq).argmax().item<int64_t>();
      if (j == m || best != drafts[static_cast<size_t>(j)]) {
        verdict = {j, best};
        break;
      }
    }
  } else {
    std::vector<at::Tensor> p;
    for (int64_t j = 0; j <= m; ++j) {
      const std::vector<int64_t> context(seq.tokens.begin(), seq.tokens.begin() + base + j);
      p.push_back(at::softmax(processed_logits(rows[j], context, seq), -1));
    }
    verdict = verify_sampled_drafts(at::stack(p), draft_probs_.at(seq.id), drafts, seq.generator);
  }
  draft_probs_.erase(seq.id);
  draft_tokens_ += m;
  accepted_draft_tokens_ += verdict.accepted;

  // The KV of the accepted drafts stays; what follows them is dropped.
  seq.tokens.resize(static_cast<size_t>(base));
  cache_->truncate(seq, base + verdict.accepted);
  cache_->publish(seq);
  drafter_->rollback(seq, base + verdict.accepted);
  RequestOutput out{.request_id = seq.id};
  std::vector<int64_t> kept(drafts.begin(), drafts.begin() + verdict.accepted);
  kept.push_back(verdict.next_token);
  for (int64_t token : kept) {
    seq.tokens.push_back(token);
    out.new_tokens.push_back(token);
    ++generated_tokens_;
    check_stop(seq, out);
    if (seq.finished()) break;
  }
  fill_progress(seq, out);
  outputs.push_back(std::move(out));
}

}  // namespace colossus::inference
