#include "colossus/inference/engine/scheduler.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace colossus::inference {

Scheduler::Scheduler(const InferenceConfig& config, KVCache& cache) : config_(config), cache_(cache) {}

void Scheduler::add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

Sequence* Scheduler::find(int64_t id) const {
  for (const auto& s : running_) if (s->id == id) return s.get();
  for (const auto& s : waiting_) if (s->id == id) return s.get();
  return nullptr;
}

std::unique_ptr<Sequence> Scheduler::remove(int64_t id) {
  auto take = [&](auto& container) -> std::unique_ptr<Sequence> {
    auto it = std::find_if(container.begin(), container.end(), [&](const auto& s) { return s->id == id; });
    if (it == container.end()) return nullptr;
    std::unique_ptr<Sequence> seq = std::move(*it);
    container.erase(it);
    cache_.free(*seq);
    return seq;
  };
  if (auto seq = take(running_)) return seq;
  return take(waiting_);
}

void Scheduler::preempt(size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  cache_.free(*seq);
  ++seq->preemptions;
  ++preemptions_;
  waiting_.push_front(std::move(seq));
}

std::vector<ScheduledSequence> Scheduler::schedule() {
  std::vector<ScheduledSequence> batch;
  int64_t budget = config_.token_budget();
  const auto remaining = [](const Sequence& s) { return s.num_tokens() - s.num_computed; };
  const auto drop_window = [&](Sequence& s) {
    if (config_.enable_streamingllm) cache_.drop_window(s, config_.start_token_size, config_.generated_token_size);
  };

  // Running sequences, oldest first; the newest give way when blocks run out.
  int64_t decode_tokens = 0;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    drop_window(seq);
    const int64_t count = std::min(remaining(seq), budget);
    if (cache_.reserve(seq, count)) {
      batch.push_back({&seq, count, seq.num_computed + count == seq.num_tokens()});
      budget -= count;
      if (count == 1) ++decode_tokens;
      ++i;
      continue;
    }
    // Out of blocks: preempt the newest running sequence not yet in the batch
    // (possibly this one) and retry.
    const size_t victim = running_.size() - 1;
    const bool self = victim == i;
    preempt(victim);
    if (self) break;
  }

  // Admit waiting sequences while there is room; prefill takes at most
  // prefill_ratio of the budget while others are decoding.
  int64_t prefill_budget = decode_tokens > 0
                               ? std::max<int64_t>(1, static_cast<int64_t>(config_.prefill_ratio * static_cast<double>(config_.token_budget())))
                               : budget;
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_batch_size) {
    const int64_t room = std::min(budget, prefill_budget);
    if (room <= 0) break;
    Sequence& seq = *waiting_.front();
    const bool fresh = seq.blocks.empty() && seq.num_computed == 0;
    if (fresh) cache_.match_prefix(seq);
    const int64_t count = std::min(remaining(seq), room);
    if (!cache_.reserve(seq, count)) {
      if (fresh) cache_.free(seq);  // do not hold prefix blocks while waiting
      break;
    }
    if (seq.arrival == 0 && seq.preemptions == 0) seq.arrival = ++next_arrival_;
    batch.push_back({&seq, count, seq.num_computed + count == seq.num_tokens()});
    budget -= count;
    prefill_budget -= count;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return batch;
}

}  // namespace colossus::inference
