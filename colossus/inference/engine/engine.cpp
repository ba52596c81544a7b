#include "colossus/inference/engine/engine.h"

#include "colossus/core/errors.h"
#include "colossus/inference/engine/speculative.h"
#include "colossus/inference/engine/text_state.h"
#include "colossus/inference/model_dir.h"
#include "colossus/metrics/memory.h"
#include "colossus/models/pretrained.h"
#include "colossus/parallel/plan/plan.h"

#include <ATen/ops/tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace colossus::inference {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return "none";
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kCpuKvCacheBytes = int64_t{4} << 30;

// Blocks for the pool: on CUDA from the memory budget (gpu_memory_utilization
// of the total, or kv_cache_memory_fraction of what is free: kv_pool_bytes),
// else enough for max_batch_size full-length sequences plus a quarter for the
// prefix cache, within kCpuKvCacheBytes.
int64_t pool_blocks(const InferenceConfig& config, const KVCacheShape& shape, const at::TensorOptions& options,
                    const models::CausalLM& model) {
  if (config.num_blocks > 0) return config.num_blocks;
  const int64_t block_bytes = shape.bytes_per_block(static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType())));
  if (options.device().is_cuda()) {
    if (auto memory = metrics::device_memory(); memory && memory->total_bytes > 0) {
      // Headroom for one step's activations and logits.
      const int64_t tokens = config.token_budget();
      const int64_t activations = tokens * (models::vocab_size(model.config()) + 16 * models::hidden_size(model.config())) * 4;
      return kv_pool_bytes(config, *memory, activations, block_bytes) / block_bytes;
    }
  }
  // A sequence never outgrows the model's context, whatever the two limits add up to.
  const int64_t longest = std::min(config.max_input_len + config.max_output_len, models::max_positions(model.config()));
  const int64_t per_sequence = ceil_div(longest, shape.block_size) + 1;
  const int64_t wanted = config.max_batch_size * per_sequence + ceil_div(config.max_batch_size * per_sequence, 4);
  // Within vLLM's CPU KV space (4 GiB), so a long-context model does not ask
  // for max_batch_size x its context in host memory; always one full sequence.
  return std::min(wanted, std::max(per_sequence, kCpuKvCacheBytes / block_bytes));
}

}  // namespace

InferenceEngine::InferenceEngine(std::shared_ptr<models::CausalLM> model, std::shared_ptr<const data::Tokenizer> tokenizer,
                                 InferenceConfig config, cluster::ProcessGroupPtr tp_group)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), config_(std::move(config)) {
  config_.validate();
  TORCH_CHECK(model_ != nullptr, "InferenceEngine needs a model");
  model_->eval();
  KVCacheShape shape = kv_cache_shape(*model_, config_.block_size);
  if (config_.tp_size > 1) {
    if (!tp_group || tp_group->size() != config_.tp_size) {
      throw ConfigError(fmt::format("tp_size is {} but the engine was given {}; pass a process group of tp_size ranks",
                                    config_.tp_size, tp_group ? fmt::format("a group of {}", tp_group->size())
                                                              : std::string("no process group")));
    }
    parallel::plan::validate_tp(model_->config(), config_.tp_size);
    sharded_ = std::make_unique<parallel::plan::ShardedModel>(
        parallel::plan::shard_model(*model_, parallel::plan::default_plan(*model_), tp_group));
    // Each rank caches its own heads; with fewer kv heads than ranks, one each.
    shape.kv_heads = shape.kv_heads % config_.tp_size == 0 ? shape.kv_heads / config_.tp_size : 1;
  } else {
    model_->fuse_projections();
  }
  const at::Tensor any = model_->parameters().front();
  const auto cache_dtype = config_.kv_cache_dtype == "auto" ? any.scalar_type() : config_.cache_dtype();
  const auto options = at::TensorOptions().dtype(cache_dtype).device(any.device());
  shape.num_blocks = pool_blocks(config_, shape, options, *model_);
  if (sharded_) {
    // Ranks must schedule identically: all take the smallest pool.
    shape.num_blocks = static_cast<int64_t>(
        sharded_->tp_group->all_reduce_scalar(static_cast<double>(shape.num_blocks), cluster::ReduceOp::Min));
  }
  cache_ = std::make_unique<KVCache>(shape, options, config_.enable_prefix_caching);
  const auto* llama = std::get_if<models::LlamaConfig>(&model_->config());
  kv_window_ = llama != nullptr && !config_.enable_streamingllm ? llama->window_on_every_layer() : 0;
  scheduler_ = std::make_unique<Scheduler>(config_, *cache_, kv_window_);
  runner_ = std::make_unique<ModelRunner>(*model_, *cache_, sharded_.get());
  if (config_.use_cuda_graph) {
    const std::string why = runner_->enable_graphs(config_.max_batch_size, config_.max_context_len_to_capture);
    if (!why.empty()) throw ConfigError(fmt::format("use_cuda_graph: {}; leave use_cuda_graph off", why));
  }
}

InferenceEngine::~InferenceEngine() = default;

std::unique_ptr<InferenceEngine> InferenceEngine::from_path(const std::string& path, InferenceConfig config,
                                                            c10::Device device) {
  config.validate();
  const std::string dir = resolve_model_dir(path);
  auto model = models::load_pretrained(dir, {.dtype = config.model_dtype(), .device = device});
  std::shared_ptr<const data::Tokenizer> tokenizer;
  // The tokenizer sits beside the weights, or one level up in a run directory.
  for (const std::string& candidate : {dir, std::filesystem::path(dir).parent_path().string()}) {
    try {
      tokenizer = data::load_tokenizer(candidate);
      break;
    } catch (const ConfigError&) {
    }
  }
  return std::make_unique<InferenceEngine>(std::move(model), std::move(tokenizer), std::move(config));
}

std::vector<RequestOutput> InferenceEngine::step() {
  std::vector<RequestOutput> outputs = std::move(aborted_);
  aborted_.clear();
  if (config_.use_spec_dec && !drafter_) {
    throw ConfigError("use_spec_dec is set but the engine has no drafter: call enable_spec_dec(drafter_model) first");
  }
  std::vector<ScheduledSequence> batch = scheduler_->schedule();
  if (batch.empty()) return outputs;
  if (drafter_) add_drafts(batch);
  // A model trained with its vocabulary padded past the tokenizer's (the
  // trainer pads to a multiple of 64) has logits for ids no text decodes to:
  // never draw them, greedy, sampled, beams or verified drafts alike.
  at::Tensor logits = drawable(runner_->run(batch));
  collect_prompt_logprobs(batch);
  ++steps_;
  finish_step(batch, logits, outputs);
  return outputs;
}

void InferenceEngine::finish_step(const std::vector<ScheduledSequence>& batch, const at::Tensor& logits,
                                  std::vector<RequestOutput>& outputs) {
  std::vector<Sequence*> sampled;
  std::vector<int64_t> sampled_rows;
  std::vector<std::pair<Sequence*, std::vector<int64_t>>> beam_groups;  // first beam, its requests' logits rows
  int64_t row = 0;
  for (const ScheduledSequence& item : batch) {
    Sequence& seq = *item.seq;
    if (seq.num_computed < seq.prompt_len) prompt_tokens_ += std::min(item.num_tokens, seq.prompt_len - seq.num_computed);
    seq.num_computed += item.num_tokens;
    if (item.num_drafts > 0) {
      verify_drafts(item, logits.narrow(0, row, item.num_drafts + 1), outputs);
      row += item.num_drafts + 1;
      continue;
    }
    cache_->publish(seq);
    if (!item.sample) continue;
    if (seq.beam) {
      if (beam_groups.empty() || beam_groups.back().first->request_id != seq.request_id) beam_groups.push_back({&seq, {}});
      beam_groups.back().second.push_back(row++);
    } else {
      sampled.push_back(&seq);
      sampled_rows.push_back(row++);
    }
  }
  for (auto& [first, rows] : beam_groups) step_beams(first->request_id, logits, rows, outputs);
  finish_requests(outputs);
  if (sampled.empty()) return;
  const bool all_rows = sampled_rows.size() == static_cast<size_t>(row);
  const std::vector<int64_t> tokens =
      draw_tokens(sampled, all_rows ? logits : logits.index_select(0, at::tensor(sampled_rows, at::kLong).to(logits.device())));
  // Logprobs of the drawn tokens, for the requests that asked (raw logits).
  std::vector<int64_t> logprob_rows, logprob_tokens, logprob_top;
  for (size_t i = 0; i < sampled.size(); ++i) {
    if (sampled[i]->logprobs < 0) continue;
    logprob_rows.push_back(sampled_rows[i]);
    logprob_tokens.push_back(tokens[i]);
    logprob_top.push_back(sampled[i]->logprobs);
  }
  std::vector<TokenLogprob> drawn_logprobs;
  if (!logprob_rows.empty()) {
    drawn_logprobs = token_logprobs(logits.index_select(0, at::tensor(logprob_rows, at::kLong).to(logits.device())),
                                    logprob_tokens, logprob_top);
  }
  size_t next_logprob = 0;
  std::vector<int64_t> failed;
  for (size_t i = 0; i < sampled.size(); ++i) {
    Sequence& seq = *sampled[i];
    seq.tokens.push_back(tokens[i]);
    ++generated_tokens_;
    RequestOutput out{.request_id = seq.id, .new_tokens = {tokens[i]}};
    if (seq.logprobs >= 0) out.logprobs.push_back(std::move(drawn_logprobs[next_logprob++]));
    out.prompt_logprobs = std::move(seq.pending_prompt_logprobs);
    seq.pending_prompt_logprobs.clear();
    try {
      check_stop(seq, out);
      fill_progress(seq, out);
    } catch (const std::exception& e) {
      // This request's own text handling failed: it ends alone, with the
      // error; the others in the batch go on.
      fill_progress(seq, out);
      out.finished = true;
      out.finish_reason = FinishReason::Abort;
      out.error = e.what();
      failed.push_back(seq.id);
    }
    outputs.push_back(std::move(out));
  }
  for (int64_t id : failed) {
    scheduler_->remove(id);
    texts_.erase(id);
    if (drafter_) drafter_->release(id);
  }
  finish_requests(outputs);
}

void InferenceEngine::fill_progress(const Sequence& seq, RequestOutput& out) {
  out.finished = seq.finished();
  out.finish_reason = seq.finish_reason;
  out.prompt_tokens = seq.prompt_len;
  out.generated_tokens = seq.num_generated();
  out.cached_prompt_tokens = seq.num_cached_prefix;
}

void InferenceEngine::finish_requests(const std::vector<RequestOutput>& outputs) {
  for (const RequestOutput& out : outputs) {
    if (!out.finished || out.finish_reason == FinishReason::Abort) continue;
    scheduler_->remove(out.request_id);
    texts_.erase(out.request_id);
    if (drafter_) drafter_->release(out.request_id);
  }
}

std::vector<std::vector<int64_t>> InferenceEngine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                            const RequestOptions& options) {
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[add_request(prompts[i], options)] = i;
  std::vector<std::vector<int64_t>> results(prompts.size());
  size_t remaining = prompts.size();
  while (remaining > 0) {
    TORCH_CHECK(has_unfinished(), "generate: requests vanished from the engine");
    for (const RequestOutput& out : step()) {
      auto it = index.find(out.request_id);
      if (it == index.end()) continue;
      auto& tokens = results[it->second];
      tokens.insert(tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
      if (out.finished) --remaining;
    }
  }
  return results;
}

std::vector<std::string> InferenceEngine::generate(const std::vector<std::string>& prompts, const RequestOptions& options) {
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[add_request(prompts[i], options)] = i;
  std::vector<std::string> results(prompts.size());
  size_t remaining = prompts.size();
  while (remaining > 0) {
    TORCH_CHECK(has_unfinished(), "generate: requests vanished from the engine");
    for (const RequestOutput& out : step()) {
      auto it = index.find(out.request_id);
      if (it == index.end()) continue;
      results[it->second] += out.new_text;
      if (out.finished) --remaining;
    }
  }
  return results;
}

EngineStats InferenceEngine::stats() const {
  const BlockAllocator& blocks = cache_->allocator();
  return EngineStats{.waiting = scheduler_->num_waiting(),
                     .running = scheduler_->num_running(),
                     .blocks_used = blocks.num_used(),
                     .blocks_total = blocks.num_blocks(),
                     .block_size = blocks.block_size(),
                     .steps = steps_,
                     .prompt_tokens = prompt_tokens_,
                     .generated_tokens = generated_tokens_,
                     .preemptions = scheduler_->num_preemptions(),
                     .prefix_cache_queries = blocks.prefix_queries(),
                     .prefix_cache_hits = blocks.prefix_hits(),
                     .draft_tokens = draft_tokens_,
                     .accepted_draft_tokens = accepted_draft_tokens_,
                     .graph_steps = runner_->graph_replays()};
}

}  // namespace colossus::inference
