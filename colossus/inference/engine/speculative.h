// Speculative decoding: a small drafter model proposes k tokens per decoding
// sequence (k cheap steps over its own paged KV cache), the target checks
// all of them in one forward, and the longest acceptable prefix plus one
// target token is kept. Greedy requests accept a draft exactly when it is
// the token plain decoding would draw, so the output is plain greedy's;
// sampled requests use rejection sampling (accept x with probability
// min(1, p(x)/q(x)), else draw from max(0, p - q)), which leaves the
// target's distribution unchanged.
#pragma once
#include "colossus/inference/engine/kv_cache.h"
#include "colossus/inference/engine/model_runner.h"
#include "colossus/inference/engine/sequence.h"
#include "colossus/models/causal_lm.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace colossus::inference {

// The sequence's processing of logits (V) at a position whose context is
// `context`: n-gram ban, repetition penalty, temperature, top-k, top-p, as
// plain sampling applies them. Returns float (V) logits (-inf = removed).
at::Tensor processed_logits(const at::Tensor& logits, const std::vector<int64_t>& context, const Sequence& seq);

struct SpecVerdict {
  int64_t accepted = 0;    // drafts kept
  int64_t next_token = 0;  // the target's token after them
};

// Rejection sampling over k drafts. p: (k + 1, V) target probabilities at
// the drafted positions and the one after; q: (k, V) drafter probabilities
// the drafts were drawn from. Uniforms and resamples draw from `generator`.
SpecVerdict verify_sampled_drafts(const at::Tensor& p, const at::Tensor& q, const std::vector<int64_t>& drafts,
                                  at::Generator& generator);

class Drafter {
 public:
  // The drafter's KV pool gets `num_blocks` blocks of `block_size` tokens.
  Drafter(std::shared_ptr<models::CausalLM> model, int64_t num_blocks, int64_t block_size);

  struct Proposal {
    std::vector<int64_t> tokens;  // k drafts
    at::Tensor probs;             // (k, V) float on CPU: the distribution each was drawn from (sampled requests)
  };
  // Up to k[i] drafts for each sequence (fewer, possibly none, when the
  // drafter's pool is short). Brings the drafter's cache up to the
  // sequence's tokens first.
  std::vector<Proposal> propose(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& k);
  // The target kept the first `valid` tokens of seq (its KV); the drafter
  // forgets what it computed past them.
  void rollback(const Sequence& seq, int64_t valid);
  void release(int64_t id);
  models::CausalLM& model() const { return *model_; }

 private:
  std::shared_ptr<models::CausalLM> model_;
  std::unique_ptr<KVCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::map<int64_t, Sequence> mirrors_;  // by target sequence id: tokens and the drafter's blocks
};

}  // namespace colossus::inference
