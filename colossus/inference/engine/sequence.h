// One request as the engine tracks it: its tokens (prompt, then generated),
// how many of them have K/V in the cache, its block table, and what ends it.
#pragma once
#include "colossus/inference/engine/beam_search.h"
#include "colossus/inference/engine/block_allocator.h"
#include "colossus/inference/sampler.h"

#include <ATen/core/Generator.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::inference {

// One token's log-probability under the model's raw distribution (the
// log-softmax of its logits before any processor, as vLLM reports them),
// with the most likely tokens at that position.
struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0.0;
  std::vector<std::pair<int64_t, double>> top;  // most likely first
};

// At most this many alternatives per position (vLLM's and OpenAI's limit).
inline constexpr int64_t kMaxTopLogprobs = 20;

// What a request may set for itself; unset fields take the engine's config.
struct RequestOptions {
  std::optional<int64_t> max_new_tokens{};
  std::optional<SamplingParams> sampling{};
  std::optional<int64_t> no_repeat_ngram_size{};
  std::optional<bool> ignore_eos{};
  // Beam search with this many beams (1 = off); the output is the best beam, at the end.
  std::optional<int64_t> beam_width{};
  // Generation ends once the generated text contains one of these (needs a tokenizer).
  std::vector<std::string> stop{};
  // Set (0..kMaxTopLogprobs): each generated token's logprob, with this many
  // alternatives (OpenAI's logprobs / top_logprobs).
  std::optional<int64_t> logprobs{};
  // Set: the prompt's tokens' logprobs too (every one but the first), with
  // this many alternatives; such a prompt is computed whole (no prefix-cache reuse).
  std::optional<int64_t> prompt_logprobs{};
};

enum class FinishReason { None, Stop, Length, Abort };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort" (OpenAI's words)

struct Sequence {
  int64_t id = 0;
  int64_t request_id = 0;  // the request it serves: its own id, or the first beam's for every beam
  // Shared by the beams of a beam-search request (null otherwise). They run
  // together: scheduled, preempted and finished as one.
  std::shared_ptr<BeamSearch> beam;
  std::vector<int64_t> tokens;  // prompt followed by generated tokens
  int64_t prompt_len = 0;
  int64_t num_computed = 0;     // leading tokens whose K/V are in the cache
  int64_t num_cached_prefix = 0;  // of those, reused from the prefix cache at admission

  // KV blocks in order. StreamingLLM drops blocks after the sinks; cache
  // position = token position - dropped_blocks * block_size past the sinks.
  std::vector<BlockId> blocks;
  int64_t dropped_blocks = 0;
  int64_t hashed_blocks = 0;  // leading full blocks published to the prefix cache
  uint64_t last_hash = 0;     // chain hash of the last of those

  // Resolved per-request settings.
  int64_t max_new_tokens = 0;
  SamplingParams sampling{};
  int64_t no_repeat_ngram_size = 0;
  std::optional<int64_t> eos_id{};
  std::vector<std::string> stop{};
  at::Generator generator;
  int64_t logprobs = -1;         // alternatives per generated token; -1: no logprobs
  int64_t prompt_logprobs = -1;  // alternatives per prompt token; -1: none
  int64_t prompt_logprobs_next = 1;  // the next prompt position to report (a recompute after preemption skips the rest)
  std::vector<TokenLogprob> pending_prompt_logprobs;  // computed, not yet handed out

  FinishReason finish_reason = FinishReason::None;
  int64_t arrival = 0;      // admission order (preemption evicts the latest)
  int64_t preemptions = 0;

  int64_t num_generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  bool finished() const { return finish_reason != FinishReason::None; }
  std::vector<int64_t> generated() const { return {tokens.begin() + prompt_len, tokens.end()}; }
};

}  // namespace colossus::inference
