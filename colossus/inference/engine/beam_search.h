// Beam search for one request, step for step as transformers' generate()
// does it (num_beams, length_penalty, early_stopping; num_return_sequences
// 1): each step keeps the 2 x width best continuations over all running
// beams, moves the top-width ones that end (eos or the length limit) into
// the finished hypotheses with the length penalty, and continues the
// width best that do not end. The arithmetic mirrors HF's tensor by tensor
// (float32, the same -1e9 masks, torch.topk's order), so ties resolve the
// same way. The engine owns the KV side: it forks beams onto their parents'
// blocks as step() says.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace colossus::inference {

class BeamSearch {
 public:
  BeamSearch(int64_t width, int64_t max_new_tokens, std::optional<int64_t> eos_id, double length_penalty,
             bool early_stopping);

  struct Next {
    std::vector<int64_t> parents;  // row of the current beams each new beam extends
    std::vector<int64_t> tokens;   // the token it appends
  };
  // logits: (R, V), one row per running beam in order (R = 1 on the first
  // step, when all beams are still the prompt). generated[r]: beam r's
  // generated tokens so far. Returns the next running beams (width of them).
  Next step(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& generated);
  bool done() const { return done_; }
  int64_t width() const { return width_; }
  // The best finished hypothesis' generated tokens (valid once done()).
  const std::vector<int64_t>& best() const;
  // Back to the start (the request was preempted and will be recomputed).
  void reset();

 private:
  int64_t width_;
  int64_t max_new_tokens_;
  std::optional<int64_t> eos_id_;
  double length_penalty_;
  bool early_stopping_;

  int64_t generated_ = 0;      // tokens each beam has generated
  at::Tensor running_scores_;  // (width) float
  at::Tensor finished_scores_;  // (width) float, -1e9 where empty
  std::vector<bool> finished_flags_;
  std::vector<std::vector<int64_t>> finished_tokens_;
  bool improvable_ = true;     // HF's is_early_stop_heuristic_unsatisfied
  bool done_ = false;
};

}  // namespace colossus::inference
