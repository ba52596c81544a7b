// The request handler: a waiting queue and a running set, and each step's
// batch chosen under a token budget. Running sequences go first (one decode
// token each, or their next prefill chunk), then waiting ones are admitted
// with a (chunked) prefill in arrival order. When the KV pool runs out, the
// latest-admitted running sequence is preempted: its blocks are freed and it
// goes back to the front of the queue, to be recomputed later.
#pragma once
#include "colossus/inference/engine/inference_config.h"
#include "colossus/inference/engine/kv_cache.h"
#include "colossus/inference/engine/sequence.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

namespace colossus::inference {

// Tokens [seq->num_computed, seq->num_computed + num_tokens) run this step;
// `sample` when they reach the end of the sequence, so its next token is drawn.
// num_drafts: the last of those tokens are speculative drafts (appended to
// seq->tokens for the step); logits come for each of them and the one before.
struct ScheduledSequence {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;
  bool sample = false;
  int64_t num_drafts = 0;
};

class Scheduler {
 public:
  // kv_window > 0: every layer attends to at most that many recent keys, so
  // blocks wholly before them are dropped (Mistral's sliding window); 0: kept.
  Scheduler(const InferenceConfig& config, KVCache& cache, int64_t kv_window);

  void add(std::unique_ptr<Sequence> seq);
  // A new beam of a running beam-search request, placed after its last beam
  // (a request's beams stay adjacent so they are scheduled as one).
  void add_beam(std::unique_ptr<Sequence> beam);
  // The next step's batch (empty when nothing can run). Blocks for it are
  // reserved; copy-on-write copies are pending in the cache.
  std::vector<ScheduledSequence> schedule();
  // Frees the blocks of a finished (or aborted) request's sequences (all its
  // beams) and hands back the one whose id is the request's.
  std::unique_ptr<Sequence> remove(int64_t request_id);

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }  // sequences (beams count one each)
  bool empty() const { return waiting_.empty() && running_.empty(); }
  int64_t num_preemptions() const { return preemptions_; }
  Sequence* find(int64_t id) const;
  // The running sequences of a request, in order (its beams).
  std::vector<Sequence*> beams_of(int64_t request_id) const;

 private:
  // Running sequences [first, end) of the request at running_[first].
  size_t unit_end(size_t first) const;
  // Sends the request whose sequences start at running_[first] back to the
  // queue (a beam search restarts from its prompt).
  void preempt(size_t first);

  const InferenceConfig& config_;
  KVCache& cache_;
  int64_t kv_window_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  int64_t next_arrival_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace colossus::inference
