#include "colossus/inference/engine/speculative.h"

#include "colossus/inference/engine/engine.h"
#include "colossus/inference/sampler.h"

#include <ATen/ops/clamp_min.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace colossus::inference {

at::Tensor processed_logits(const at::Tensor& logits, const std::vector<int64_t>& context, const Sequence& seq) {
  at::Tensor row = logits.to(at::kFloat).cpu().clone();
  ban_repeated_ngrams(row, context, seq.no_repeat_ngram_size);
  return process_logits(row.unsqueeze(0), {context}, seq.sampling).squeeze(0);
}

namespace {

double uniform(at::Generator& generator) {
  at::Tensor u = at::empty({1}, at::kDouble);
  u.uniform_(0.0, 1.0, generator);
  return u.item<double>();
}

int64_t draw(const at::Tensor& probs, at::Generator& generator) {
  return at::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
}

}  // namespace

SpecVerdict verify_sampled_drafts(const at::Tensor& p, const at::Tensor& q, const std::vector<int64_t>& drafts,
                                  at::Generator& generator) {
  const auto k = static_cast<int64_t>(drafts.size());
  TORCH_CHECK(p.size(0) == k + 1 && q.size(0) == k, "verify_sampled_drafts: ", k, " drafts need p (k+1, V), q (k, V)");
  for (int64_t j = 0; j < k; ++j) {
    const int64_t x = drafts[static_cast<size_t>(j)];
    const double px = p[j][x].item<double>(), qx = q[j][x].item<double>();
    if (qx > 0.0 && uniform(generator) * qx < px) continue;  // accept with probability min(1, p/q)
    at::Tensor residual = at::clamp_min(p[j] - q[j], 0.0);
    // p == q up to rounding leaves no residual mass: p itself is then the residual's limit.
    const at::Tensor from = residual.sum().item<double>() > 1e-12 ? residual : p[j];
    return {j, draw(from, generator)};
  }
  return {k, draw(p[k], generator)};
}

Drafter::Drafter(std::shared_ptr<models::CausalLM> model, int64_t num_blocks, int64_t block_size)
    : model_(std::move(model)) {
  model_->eval();
  model_->fuse_projections();
  KVCacheShape shape = kv_cache_shape(*model_, block_size);
  shape.num_blocks = num_blocks;
  const at::Tensor any = model_->parameters().front();
  cache_ = std::make_unique<KVCache>(shape, any.options(), /*enable_prefix_caching=*/false);
  runner_ = std::make_unique<ModelRunner>(*model_, *cache_);
}

std::vector<Drafter::Proposal> Drafter::propose(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& k) {
  std::vector<Proposal> proposals(seqs.size());
  std::vector<size_t> active;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& mirror = mirrors_[seqs[i]->id];
    mirror.id = seqs[i]->id;
    mirror.tokens = seqs[i]->tokens;
    mirror.prompt_len = seqs[i]->prompt_len;
    if (k[i] > 0) active.push_back(i);
  }
  std::vector<std::vector<at::Tensor>> probs(seqs.size());
  for (int64_t round = 0; !active.empty(); ++round) {
    std::vector<ScheduledSequence> batch;
    std::vector<size_t> ran;
    for (size_t i : active) {
      Sequence& mirror = mirrors_[seqs[i]->id];
      // The first round catches up on every token the drafter has not seen.
      const int64_t count = mirror.num_tokens() - mirror.num_computed;
      if (!cache_->reserve(mirror, count)) {
        if (round == 0) release(seqs[i]->id);  // its pool share is better spent on others
        continue;
      }
      batch.push_back({&mirror, count, true});
      ran.push_back(i);
    }
    if (batch.empty()) break;
    at::Tensor logits = runner_->run(batch).to(at::kFloat).cpu();
    active.clear();
    for (size_t r = 0; r < ran.size(); ++r) {
      const size_t i = ran[r];
      Sequence& mirror = mirrors_[seqs[i]->id];
      mirror.num_computed += batch[r].num_tokens;
      const Sequence& seq = *seqs[i];
      int64_t token;
      if (seq.sampling.greedy()) {
        at::Tensor processed = processed_logits(logits[static_cast<int64_t>(r)], mirror.tokens, seq);
        token = processed.argmax().item<int64_t>();
      } else {
        at::Tensor q = at::softmax(processed_logits(logits[static_cast<int64_t>(r)], mirror.tokens, seq), -1);
        Sequence& target = *seqs[i];
        token = draw(q, target.generator);
        probs[i].push_back(q);
      }
      mirror.tokens.push_back(token);
      proposals[i].tokens.push_back(token);
      if (static_cast<int64_t>(proposals[i].tokens.size()) < k[i]) active.push_back(i);
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!probs[i].empty()) proposals[i].probs = at::stack(probs[i]);
  }
  return proposals;
}

void Drafter::rollback(const Sequence& seq, int64_t valid) {
  auto it = mirrors_.find(seq.id);
  if (it == mirrors_.end()) return;
  Sequence& mirror = it->second;
  cache_->truncate(mirror, std::min(valid, mirror.num_computed));
  mirror.tokens = seq.tokens;
}

void Drafter::release(int64_t id) {
  auto it = mirrors_.find(id);
  if (it == mirrors_.end()) return;
  cache_->free(it->second);
  mirrors_.erase(it);
}

}  // namespace colossus::inference
