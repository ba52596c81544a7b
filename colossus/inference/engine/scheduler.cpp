#include "colossus/inference/engine/scheduler.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace colossus::inference {

Scheduler::Scheduler(const InferenceConfig& config, KVCache& cache, int64_t kv_window)
    : config_(config), cache_(cache), kv_window_(kv_window) {}

void Scheduler::add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

void Scheduler::add_beam(std::unique_ptr<Sequence> beam) {
  auto last = std::find_if(running_.rbegin(), running_.rend(),
                           [&](const auto& s) { return s->request_id == beam->request_id; });
  TORCH_CHECK(last != running_.rend(), "add_beam: request ", beam->request_id, " is not running");
  running_.insert(last.base(), std::move(beam));
}

Sequence* Scheduler::find(int64_t id) const {
  for (const auto& s : running_) if (s->id == id) return s.get();
  for (const auto& s : waiting_) if (s->id == id) return s.get();
  return nullptr;
}

std::vector<Sequence*> Scheduler::beams_of(int64_t request_id) const {
  std::vector<Sequence*> beams;
  for (const auto& s : running_) if (s->request_id == request_id) beams.push_back(s.get());
  return beams;
}

std::unique_ptr<Sequence> Scheduler::remove(int64_t request_id) {
  std::unique_ptr<Sequence> root;
  const auto take_all = [&](auto& container) {
    for (auto it = container.begin(); it != container.end();) {
      if ((*it)->request_id != request_id) {
        ++it;
        continue;
      }
      cache_.free(**it);
      if ((*it)->id == request_id) root = std::move(*it);
      it = container.erase(it);
    }
  };
  take_all(running_);
  take_all(waiting_);
  return root;
}

size_t Scheduler::unit_end(size_t first) const {
  size_t end = first + 1;
  while (end < running_.size() && running_[end]->request_id == running_[first]->request_id) ++end;
  return end;
}

void Scheduler::preempt(size_t first) {
  const size_t end = unit_end(first);
  std::unique_ptr<Sequence> root;
  for (size_t i = first; i < end; ++i) {
    cache_.free(*running_[i]);
    if (running_[i]->id == running_[i]->request_id) root = std::move(running_[i]);
  }
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(first), running_.begin() + static_cast<std::ptrdiff_t>(end));
  TORCH_CHECK(root != nullptr, "preempted a request without its first sequence");
  if (root->beam) {
    // The other beams are gone: start the search again from the prompt.
    root->tokens.resize(static_cast<size_t>(root->prompt_len));
    root->beam->reset();
  }
  ++root->preemptions;
  ++preemptions_;
  waiting_.push_front(std::move(root));
}

std::vector<ScheduledSequence> Scheduler::schedule() {
  std::vector<ScheduledSequence> batch;
  int64_t budget = config_.token_budget();
  const auto remaining = [](const Sequence& s) { return s.num_tokens() - s.num_computed; };
  const auto drop_window = [&](Sequence& s) {
    if (config_.enable_streamingllm) {
      cache_.drop_window(s, config_.start_token_size, config_.generated_token_size);
    } else if (kv_window_ > 0) {
      // Keeps at least kv_window cached tokens: all the next query can see.
      cache_.drop_window(s, 0, kv_window_);
    }
  };

  // Running requests, oldest first, each as one unit (a beam search's beams
  // together); the newest give way when blocks run out.
  int64_t decode_tokens = 0;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const size_t end = unit_end(i);
    const bool single = end == i + 1;
    int64_t tokens = 0, blocks = 0;
    for (size_t j = i; j < end; ++j) {
      drop_window(*running_[j]);
      // A single sequence may take a partial prefill chunk; beams decode one token each.
      const int64_t count = single ? std::min(remaining(*running_[j]), budget) : remaining(*running_[j]);
      tokens += count;
      blocks += cache_.blocks_needed(*running_[j], count);
    }
    if (tokens > budget) break;  // beams that do not fit this step's budget wait for the next
    if (blocks <= cache_.allocator().num_available()) {
      for (size_t j = i; j < end; ++j) {
        Sequence& seq = *running_[j];
        const int64_t count = single ? std::min(remaining(seq), budget) : remaining(seq);
        TORCH_CHECK(cache_.reserve(seq, count), "KV reserve failed after the pool was checked");
        batch.push_back({&seq, count, seq.num_computed + count == seq.num_tokens()});
        if (count == 1) ++decode_tokens;
      }
      budget -= tokens;
      i = end;
      continue;
    }
    // Out of blocks: preempt the newest running request not yet in the batch
    // (possibly this one) and retry.
    size_t victim = running_.size() - 1;
    while (victim > 0 && running_[victim - 1]->request_id == running_[victim]->request_id) --victim;
    const bool self = victim == i;
    preempt(victim);
    if (self) break;
  }

  // Admit waiting requests while there is room; prefill takes at most
  // prefill_ratio of the budget while others are decoding. A beam search
  // needs room for all its beams.
  int64_t prefill_budget = decode_tokens > 0
                               ? std::max<int64_t>(1, static_cast<int64_t>(config_.prefill_ratio * static_cast<double>(config_.token_budget())))
                               : budget;
  while (!waiting_.empty()) {
    Sequence& seq = *waiting_.front();
    const int64_t slots = seq.beam ? seq.beam->width() : 1;
    if (static_cast<int64_t>(running_.size()) + slots > config_.max_batch_size) break;
    const int64_t room = std::min(budget, prefill_budget);
    if (room <= 0) break;
    const bool fresh = seq.blocks.empty() && seq.num_computed == 0;
    // Prompt logprobs need every prompt position's logits: no reuse.
    if (fresh && seq.prompt_logprobs < 0) cache_.match_prefix(seq);
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
