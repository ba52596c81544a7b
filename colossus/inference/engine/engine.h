// InferenceEngine: Colossal-AI's engine, natively. Requests are added (token
// ids or text), each step() runs one batch chosen by the scheduler over the
// paged KV cache (continuous batching: requests join and leave between
// steps) and reports what each request produced; generate() runs requests to
// completion. Not thread-safe: one thread drives it (the server owns one).
#pragma once
#include "colossus/data/tokenizer.h"
#include "colossus/inference/engine/inference_config.h"
#include "colossus/inference/engine/kv_cache.h"
#include "colossus/inference/engine/model_runner.h"
#include "colossus/inference/engine/scheduler.h"
#include "colossus/inference/engine/sequence.h"
#include "colossus/inference/text_stream.h"
#include "colossus/models/causal_lm.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::inference {

class Drafter;

struct RequestOutput {
  int64_t request_id = 0;
  std::vector<int64_t> new_tokens;  // drawn this step
  std::string new_text;             // newly final text (with a tokenizer; stop strings held back, then cut)
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // reused from the prefix cache
  // Set when this request alone failed (finished, finish_reason Abort): why.
  std::optional<std::string> error{};
  // With RequestOptions::logprobs: one per new token.
  std::vector<TokenLogprob> logprobs{};
  // With RequestOptions::prompt_logprobs: prompt positions 1.. (in the first
  // output that has a new token).
  std::vector<TokenLogprob> prompt_logprobs{};
};

struct EngineStats {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t blocks_used = 0;
  int64_t blocks_total = 0;
  int64_t block_size = 0;
  int64_t steps = 0;
  int64_t prompt_tokens = 0;     // computed in prefill (prefix-cache hits excluded)
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t draft_tokens = 0;           // proposed by the drafter (speculative decoding)
  int64_t accepted_draft_tokens = 0;  // of those, kept by the model
  int64_t graph_steps = 0;            // decode steps replayed from CUDA graphs
};

class InferenceEngine {
 public:
  // The model is put in eval mode; the KV pool is allocated on its device.
  // tokenizer may be null (token-id requests only). With config.tp_size > 1
  // the (full, identical on every rank) model is sharded over tp_group, whose
  // size must be tp_size; every rank then drives its engine with the same
  // requests in the same order and gets the same outputs.
  InferenceEngine(std::shared_ptr<models::CausalLM> model, std::shared_ptr<const data::Tokenizer> tokenizer,
                  InferenceConfig config, cluster::ProcessGroupPtr tp_group = nullptr);
  // A model directory, training checkpoint or run directory (see model_dir.h),
  // with the tokenizer found beside the weights.
  static std::unique_ptr<InferenceEngine> from_path(const std::string& path, InferenceConfig config,
                                                    c10::Device device = c10::kCPU);
  ~InferenceEngine();

  // Queues a request; returns its id. Throws ConfigError for an empty or
  // too-long prompt, a token id outside the vocabulary, bad options, or a
  // request that could never fit the KV pool or the model's positions.
  int64_t add_request(std::vector<int64_t> prompt, const RequestOptions& options = {});
  int64_t add_request(const std::string& prompt, const RequestOptions& options = {});
  // Ends a request now (a client went away): its blocks are freed. Unknown ids are ignored.
  void abort_request(int64_t id);

  // One batch; outputs for the requests that ran (and those aborted since).
  std::vector<RequestOutput> step();
  bool has_unfinished() const { return !scheduler_->empty(); }

  // Runs all prompts to completion; returns each one's generated ids, in order.
  std::vector<std::vector<int64_t>> generate(const std::vector<std::vector<int64_t>>& prompts,
                                             const RequestOptions& options = {});
  std::vector<std::string> generate(const std::vector<std::string>& prompts, const RequestOptions& options = {});

  // Speculative decoding with `drafter` (same vocabulary, same device)
  // proposing n_spec_tokens per step (0 = config's max_n_spec_tokens).
  void enable_spec_dec(std::shared_ptr<models::CausalLM> drafter, int64_t n_spec_tokens = 0);
  void disable_spec_dec();

  const InferenceConfig& config() const { return config_; }
  const data::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  models::CausalLM& model() const { return *model_; }
  EngineStats stats() const;

 private:
  struct TextState;
  void finish_step(const std::vector<ScheduledSequence>& batch, const at::Tensor& logits,
                   std::vector<RequestOutput>& outputs);
  void finish_requests(const std::vector<RequestOutput>& outputs);
  void add_drafts(std::vector<ScheduledSequence>& batch);
  void verify_drafts(const ScheduledSequence& item, const at::Tensor& logits, std::vector<RequestOutput>& outputs);
  // One beam-search step of request_id from its beams' logits rows.
  void step_beams(int64_t request_id, const at::Tensor& logits, const std::vector<int64_t>& rows,
                  std::vector<RequestOutput>& outputs);
  std::vector<int64_t> draw_tokens(const std::vector<Sequence*>& seqs, const at::Tensor& logits);
  // Prompt logprobs of the batch's prefill chunks that asked for them, from
  // the runner's last hidden states (engine_logprobs.cpp).
  void collect_prompt_logprobs(const std::vector<ScheduledSequence>& batch);
  // Vocabulary columns past the tokenizer's, dropped (see step()).
  at::Tensor drawable(const at::Tensor& logits) const;
  void check_stop(Sequence& seq, RequestOutput& out);
  // A request's progress into its step output: counts, and whether and why it finished.
  static void fill_progress(const Sequence& seq, RequestOutput& out);

  std::shared_ptr<models::CausalLM> model_;
  std::shared_ptr<const data::Tokenizer> tokenizer_;
  InferenceConfig config_;
  std::unique_ptr<KVCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t kv_window_ = 0;  // the model's window on every layer (0: none): older KV blocks are dropped
  std::unique_ptr<parallel::plan::ShardedModel> sharded_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Drafter> drafter_;
  int64_t n_spec_tokens_ = 0;
  std::map<int64_t, at::Tensor> draft_probs_;  // sampled requests' drafter distributions, this step
  int64_t draft_tokens_ = 0;
  int64_t accepted_draft_tokens_ = 0;
  std::map<int64_t, std::unique_ptr<TextState>> texts_;
  std::vector<RequestOutput> aborted_;
  int64_t next_id_ = 1;
  int64_t steps_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t generated_tokens_ = 0;
};

// Each row's `tokens[i]` log-probability and its top[i] most likely tokens,
// from logits (R, V) (log-softmax in float32).
std::vector<TokenLogprob> token_logprobs(const at::Tensor& logits, const std::vector<int64_t>& tokens,
                                         const std::vector<int64_t>& top);

// OpenAI's presence and frequency penalties of seq's sampling params on its
// generated tokens, subtracted from logits (V) float32 (contiguous).
void apply_output_penalties(at::Tensor& logits, const Sequence& seq);

// Sets the logits (V) of tokens that would repeat an n-gram of `tokens` to
// -inf, as transformers' NoRepeatNGramLogitsProcessor. logits: (V) float.
void ban_repeated_ngrams(at::Tensor& logits, const std::vector<int64_t>& tokens, int64_t n);

}  // namespace colossus::inference
