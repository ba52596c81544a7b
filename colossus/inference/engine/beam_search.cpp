#include "colossus/inference/engine/beam_search.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace colossus::inference {

namespace {
constexpr double kMasked = -1.0e9;  // HF's "cannot be chosen" score

std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}
}  // namespace

BeamSearch::BeamSearch(int64_t width, int64_t max_new_tokens, std::optional<int64_t> eos_id, double length_penalty,
                       bool early_stopping)
    : width_(width),
      max_new_tokens_(max_new_tokens),
      eos_id_(eos_id),
      length_penalty_(length_penalty),
      early_stopping_(early_stopping) {
  TORCH_CHECK(width >= 1 && max_new_tokens >= 1, "beam search needs width >= 1 and max_new_tokens >= 1");
  reset();
}

void BeamSearch::reset() {
  generated_ = 0;
  running_scores_ = at::zeros({width_}, at::kFloat);
  running_scores_.narrow(0, 1, width_ - 1).fill_(kMasked);
  finished_scores_ = at::full({width_}, kMasked, at::kFloat);
  finished_flags_.assign(static_cast<size_t>(width_), false);
  finished_tokens_.assign(static_cast<size_t>(width_), {});
  improvable_ = true;
  done_ = false;
}

const std::vector<int64_t>& BeamSearch::best() const { return finished_tokens_.front(); }

BeamSearch::Next BeamSearch::step(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& generated) {
  TORCH_CHECK(!done_, "beam search stepped after it finished");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(rows == (generated_ == 0 ? 1 : width_) && static_cast<int64_t>(generated.size()) == rows,
              "beam search got ", rows, " rows of logits for ", width_, " beams");
  const int64_t keep = 2 * width_;  // HF: max(2, 1 + number of eos ids) x width, with at most one eos id
  // On the first step the other beams are copies of the prompt scored -1e9:
  // every top continuation comes from row 0, so row 0 alone gives the same.
  at::Tensor scores = at::log_softmax(logits.to(at::kFloat).cpu(), -1) + running_scores_.narrow(0, 0, rows).view({rows, 1});
  auto [top_scores, top_index] = at::topk(scores.reshape({-1}), keep);
  const std::vector<int64_t> flat = to_vector(top_index);
  std::vector<int64_t> parent(flat.size()), token(flat.size());
  std::vector<bool> hits(flat.size());
  at::Tensor hit_mask = at::zeros({keep}, at::kBool);
  bool all_hit = true;
  for (size_t k = 0; k < flat.size(); ++k) {
    parent[k] = flat[k] / vocab;
    token[k] = flat[k] % vocab;
    hits[k] = (eos_id_ && token[k] == *eos_id_) || generated_ + 1 >= max_new_tokens_;
    hit_mask[static_cast<int64_t>(k)] = static_cast<bool>(hits[k]);
    all_hit = all_hit && hits[k];
  }

  // The width best continuations that do not end run on.
  at::Tensor running = top_scores + hit_mask.to(at::kFloat) * kMasked;
  auto [next_scores, next_index] = at::topk(running, width_);
  running_scores_ = next_scores.contiguous();
  Next next;
  for (int64_t k : to_vector(next_index)) {
    next.parents.push_back(parent[static_cast<size_t>(k)]);
    next.tokens.push_back(token[static_cast<size_t>(k)]);
  }

  // The top-width continuations that end become finished hypotheses if they
  // beat the current ones.
  at::Tensor candidate = top_scores / std::pow(static_cast<double>(generated_ + 1), length_penalty_);
  bool all_finished = true;
  for (bool f : finished_flags_) all_finished = all_finished && f;
  if (all_finished && early_stopping_) candidate += kMasked;
  if (!improvable_) candidate += kMasked;
  at::Tensor just_finished = at::zeros({keep}, at::kBool);
  for (int64_t k = 0; k < keep; ++k) just_finished[k] = static_cast<bool>(hits[static_cast<size_t>(k)] && k < width_);
  candidate += (~just_finished).to(at::kFloat) * kMasked;
  at::Tensor merged = at::cat({finished_scores_, candidate});
  auto [best_scores, best_index] = at::topk(merged, width_);
  std::vector<std::vector<int64_t>> tokens;
  std::vector<bool> flags;
  for (int64_t m : to_vector(best_index)) {
    if (m < width_) {
      tokens.push_back(finished_tokens_[static_cast<size_t>(m)]);
      flags.push_back(finished_flags_[static_cast<size_t>(m)]);
    } else {
      const auto k = static_cast<size_t>(m - width_);
      std::vector<int64_t> hypothesis = generated[static_cast<size_t>(parent[k])];
      hypothesis.push_back(token[k]);
      tokens.push_back(std::move(hypothesis));
      flags.push_back(k < static_cast<size_t>(width_) && hits[k]);
    }
  }
  finished_scores_ = best_scores.contiguous();
  finished_tokens_ = std::move(tokens);
  finished_flags_ = std::move(flags);
  ++generated_;

  // Can a running beam still beat the worst finished one?
  all_finished = true;
  for (bool f : finished_flags_) all_finished = all_finished && f;
  // In float32, as HF divides a float tensor by a Python float.
  const float best_running =
      (running_scores_.narrow(0, 0, 1) / std::pow(static_cast<double>(generated_), length_penalty_)).item<float>();
  const float worst_finished = all_finished ? finished_scores_.min().item<float>() : static_cast<float>(kMasked);
  improvable_ = improvable_ && best_running > worst_finished;
  done_ = !improvable_ || (all_finished && early_stopping_) || all_hit;
  return next;
}

}  // namespace colossus::inference
