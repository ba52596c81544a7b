// One beam-search step of a request: the search picks the next beams, each
// forks its parent's KV blocks (KVCache::fork), and a finished search
// returns its best sequence.
#include "colossus/inference/engine/engine.h"

#include "colossus/inference/engine/text_state.h"

#include <ATen/ops/tensor.h>

namespace colossus::inference {

void InferenceEngine::step_beams(int64_t request_id, const at::Tensor& logits, const std::vector<int64_t>& rows,
                                 std::vector<RequestOutput>& outputs) {
  std::vector<Sequence*> beams = scheduler_->beams_of(request_id);
  TORCH_CHECK(beams.size() == rows.size(), "beam search: ", rows.size(), " logits rows for ", beams.size(), " beams");
  std::vector<std::vector<int64_t>> generated;
  for (const Sequence* b : beams) generated.push_back(b->generated());
  BeamSearch& search = *beams.front()->beam;
  const BeamSearch::Next next =
      search.step(logits.index_select(0, at::tensor(rows, at::kLong).to(logits.device())), generated);
  generated_tokens_ += static_cast<int64_t>(beams.size());
  Sequence& root = *beams.front();
  if (search.done()) {
    const std::vector<int64_t>& best = search.best();
    RequestOutput out{.request_id = request_id, .new_tokens = best, .finished = true,
                      .finish_reason = root.eos_id && !best.empty() && best.back() == *root.eos_id ? FinishReason::Stop
                                                                                                 : FinishReason::Length,
                      .prompt_tokens = root.prompt_len, .generated_tokens = static_cast<int64_t>(best.size()),
                      .cached_prompt_tokens = root.num_cached_prefix};
    if (tokenizer_) out.new_text = tokenizer_->decode(std::vector<int32_t>(best.begin(), best.end()), true);
    outputs.push_back(std::move(out));
    scheduler_->remove(request_id);
    texts_.erase(request_id);
    return;
  }
  // Each new beam forks its parent (KVCache::fork: its tokens and shared KV
  // blocks; a shared last block is copied when a beam writes into it). Forked
  // into scratch sequences first: a beam can be a parent and be replaced.
  std::vector<Sequence> forks(next.parents.size());
  for (size_t i = 0; i < forks.size(); ++i) {
    const Sequence& parent = *beams[static_cast<size_t>(next.parents[i])];
    cache_->fork(parent, forks[i]);
    forks[i].tokens = parent.tokens;
    forks[i].tokens.push_back(next.tokens[i]);
  }
  for (size_t i = 0; i < forks.size(); ++i) {
    Sequence* beam = i < beams.size() ? beams[i] : nullptr;
    std::unique_ptr<Sequence> fresh;
    if (!beam) {
      fresh = std::make_unique<Sequence>(root);
      fresh->id = next_id_++;
      fresh->blocks.clear();
      beam = fresh.get();
    } else {
      cache_->free(*beam);
    }
    Sequence& fork = forks[i];
    beam->tokens = std::move(fork.tokens);
    beam->blocks = std::move(fork.blocks);
    beam->num_computed = fork.num_computed;
    beam->dropped_blocks = fork.dropped_blocks;
    beam->hashed_blocks = fork.hashed_blocks;
    beam->last_hash = fork.last_hash;
    if (fresh) scheduler_->add_beam(std::move(fresh));
  }
}

}  // namespace colossus::inference
