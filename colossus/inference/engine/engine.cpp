#include "colossus/inference/engine/engine.h"

#include "colossus/inference/engine/speculative.h"

#include "colossus/core/errors.h"
#include "colossus/inference/model_dir.h"
#include "colossus/metrics/memory.h"
#include "colossus/models/pretrained.h"
#include "colossus/parallel/plan/plan.h"

#include <ATen/ops/full.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <set>

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

// Text of a request's generated tokens, for stop strings and streamed text.
struct InferenceEngine::TextState {
  explicit TextState(const data::Tokenizer& tokenizer) : stream(tokenizer) {}
  TextStream stream;
  std::string text;     // final text so far
  size_t emitted = 0;   // bytes of text handed out
  size_t holdback = 0;  // longest stop string - 1: text that may still become a stop string
};

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for the pool: from free device memory on CUDA, else enough for
// max_batch_size full-length sequences plus a quarter for the prefix cache.
int64_t pool_blocks(const InferenceConfig& config, const KVCacheShape& shape, const at::TensorOptions& options,
                    const models::CausalLM& model) {
  if (config.num_blocks > 0) return config.num_blocks;
  const int64_t block_bytes = shape.bytes_per_block(static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType())));
  if (options.device().is_cuda()) {
    if (auto memory = metrics::device_memory(); memory && memory->total_bytes > 0) {
      const int64_t reusable = memory->free_bytes + memory->reserved_bytes - memory->allocated_bytes;
      // Headroom for one step's activations and logits.
      const int64_t tokens = config.token_budget();
      const int64_t activations = tokens * (models::vocab_size(model.config()) + 16 * models::hidden_size(model.config())) * 4;
      const auto budget = static_cast<int64_t>(config.kv_cache_memory_fraction * static_cast<double>(reusable)) - activations;
      if (budget < block_bytes) {
        throw ConfigError(fmt::format("no device memory is left for the KV cache ({} MiB free after the model); "
                                      "lower max_num_batched_tokens or set num_blocks",
                                      reusable >> 20));
      }
      return budget / block_bytes;
    }
  }
  const int64_t per_sequence = ceil_div(config.max_input_len + config.max_output_len, shape.block_size) + 1;
  return config.max_batch_size * per_sequence + ceil_div(config.max_batch_size * per_sequence, 4);
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
    at::Tensor blocks = at::full({1}, shape.num_blocks, at::kLong).to(any.device());
    sharded_->tp_group->all_reduce(blocks, cluster::ReduceOp::Min).wait();
    shape.num_blocks = blocks.cpu().item<int64_t>();
  }
  cache_ = std::make_unique<KVCache>(shape, options, config_.enable_prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(config_, *cache_);
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

int64_t InferenceEngine::add_request(const std::string& prompt, const RequestOptions& options) {
  if (!tokenizer_) throw ConfigError("a text prompt needs a tokenizer; this engine has none (pass token ids)");
  std::vector<int32_t> ids = tokenizer_->encode(prompt, /*add_special_tokens=*/true);
  return add_request(std::vector<int64_t>(ids.begin(), ids.end()), options);
}

int64_t InferenceEngine::add_request(std::vector<int64_t> prompt, const RequestOptions& options) {
  const int64_t vocab = models::vocab_size(model_->config());
  if (prompt.empty()) throw ConfigError("the prompt is empty; a request needs at least one token");
  if (static_cast<int64_t>(prompt.size()) > config_.max_input_len) {
    throw ConfigError(fmt::format("the prompt has {} tokens but max_input_len is {}", prompt.size(), config_.max_input_len));
  }
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) throw ConfigError(fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, vocab));
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->request_id = seq->id;
  seq->prompt_len = static_cast<int64_t>(prompt.size());
  seq->tokens = std::move(prompt);
  seq->max_new_tokens = options.max_new_tokens.value_or(config_.max_output_len);
  if (seq->max_new_tokens < 1 || seq->max_new_tokens > config_.max_output_len) {
    throw ConfigError(fmt::format("max_new_tokens is {}; it must be in [1, {}] (max_output_len)", seq->max_new_tokens,
                                  config_.max_output_len));
  }
  seq->sampling = options.sampling.value_or(config_.default_sampling());
  seq->sampling.validate();
  seq->no_repeat_ngram_size = options.no_repeat_ngram_size.value_or(config_.no_repeat_ngram_size);
  if (seq->no_repeat_ngram_size < 0) {
    throw ConfigError(fmt::format("no_repeat_ngram_size is {}; use 0 (off) or a positive n", seq->no_repeat_ngram_size));
  }
  if (!options.ignore_eos.value_or(config_.ignore_eos)) {
    if (config_.eos_token_id) seq->eos_id = config_.eos_token_id;
    else if (tokenizer_ && tokenizer_->eos_id()) seq->eos_id = *tokenizer_->eos_id();
  }
  const int64_t width = options.beam_width.value_or(config_.beam_width);
  if (width > 1) {
    if (width > config_.max_batch_size || 2 * width > vocab) {
      throw ConfigError(fmt::format("beam_width {} needs width <= max_batch_size ({}) and 2 x width <= the vocabulary ({})",
                                    width, config_.max_batch_size, vocab));
    }
    if (!seq->sampling.greedy() || seq->sampling.repetition_penalty != 1.0 || seq->no_repeat_ngram_size > 0 ||
        !options.stop.empty() || config_.enable_streamingllm || config_.forced_eos_token_id) {
      throw ConfigError(fmt::format("beam search (beam_width {}) is deterministic and scores whole sequences: it does not "
                                    "combine with sampling, repetition_penalty, no_repeat_ngram_size, stop strings, "
                                    "forced_eos_token_id or StreamingLLM",
                                    width));
    }
    seq->beam = std::make_shared<BeamSearch>(width, seq->max_new_tokens, seq->eos_id, config_.length_penalty,
                                             config_.early_stopping);
  } else if (width < 1) {
    throw ConfigError(fmt::format("beam_width is {}; use 1 (off) or more beams", width));
  }
  seq->stop = options.stop;
  if (!seq->stop.empty() && !tokenizer_) throw ConfigError("stop strings need a tokenizer; this engine has none");
  for (const auto& s : seq->stop) {
    if (s.empty()) throw ConfigError("a stop string is empty; remove it or give at least one character");
  }
  const int64_t total = seq->prompt_len + seq->max_new_tokens;
  if (const auto* gpt2 = std::get_if<models::GPT2Config>(&model_->config()); gpt2 && total > gpt2->n_positions) {
    throw ConfigError(fmt::format("prompt ({} tokens) + max_new_tokens ({}) is {}, past the model's n_positions {}",
                                  seq->prompt_len, seq->max_new_tokens, total, gpt2->n_positions));
  }
  const int64_t bs = cache_->block_size();
  const int64_t most_cached = config_.enable_streamingllm
                                  ? std::min(total, config_.start_token_size + config_.generated_token_size + 2 * bs)
                                  : total;
  const int64_t blocks_needed = (ceil_div(most_cached, bs) + 1) * width;
  if (blocks_needed > cache_->allocator().num_blocks()) {
    throw ConfigError(fmt::format("a request of {} tokens{} needs {} KV blocks of {} tokens but the pool has {}; "
                                  "shorten it, or give the cache more blocks (num_blocks)",
                                  total, width > 1 ? fmt::format(" with {} beams", width) : "", blocks_needed, bs,
                                  cache_->allocator().num_blocks()));
  }
  seq->generator = make_cpu_generator(seq->sampling.seed);
  if (tokenizer_) {
    auto text = std::make_unique<TextState>(*tokenizer_);
    for (const auto& s : seq->stop) text->holdback = std::max(text->holdback, s.size() - 1);
    texts_[seq->id] = std::move(text);
  }
  const int64_t id = seq->id;
  scheduler_->add(std::move(seq));
  return id;
}

void InferenceEngine::abort_request(int64_t id) {
  std::unique_ptr<Sequence> seq = scheduler_->remove(id);
  if (!seq) return;
  texts_.erase(id);
  if (drafter_) drafter_->release(id);
  aborted_.push_back({.request_id = id, .finished = true, .finish_reason = FinishReason::Abort,
                      .prompt_tokens = seq->prompt_len, .generated_tokens = seq->num_generated()});
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
  at::Tensor logits = runner_->run(batch);
  // A model trained with its vocabulary padded past the tokenizer's (the
  // trainer pads to a multiple of 64) has logits for ids no text decodes to:
  // never draw them, greedy, sampled, beams or verified drafts alike.
  if (tokenizer_ && tokenizer_->vocab_size() < logits.size(-1)) logits = logits.narrow(-1, 0, tokenizer_->vocab_size());
  ++steps_;
  finish_step(batch, logits, outputs);
  return outputs;
}

void ban_repeated_ngrams(at::Tensor& logits, const std::vector<int64_t>& tokens, int64_t n) {
  const auto len = static_cast<int64_t>(tokens.size());
  if (n < 1 || len + 1 < n) return;
  std::set<int64_t> banned;
  // Every earlier n-gram whose first n-1 tokens equal the last n-1 tokens.
  for (int64_t start = 0; start + n <= len; ++start) {
    if (std::equal(tokens.begin() + start, tokens.begin() + start + n - 1, tokens.end() - (n - 1))) {
      banned.insert(tokens[static_cast<size_t>(start + n - 1)]);
    }
  }
  for (int64_t t : banned) logits[t] = -std::numeric_limits<float>::infinity();
}

std::vector<int64_t> InferenceEngine::draw_tokens(const std::vector<Sequence*>& seqs, const at::Tensor& logits) {
  const bool plain_greedy = std::all_of(seqs.begin(), seqs.end(), [](const Sequence* s) {
    return s->sampling.greedy() && s->sampling.repetition_penalty == 1.0 && s->no_repeat_ngram_size == 0;
  });
  std::vector<int64_t> tokens;
  if (plain_greedy) {
    at::Tensor best = logits.argmax(-1).cpu();  // the step's one device-to-host copy
    tokens.assign(best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + best.numel());
  } else {
    at::Tensor rows = logits.to(at::kFloat).cpu();
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& seq = *seqs[i];
      at::Tensor row = rows[static_cast<int64_t>(i)].clone();
      ban_repeated_ngrams(row, seq.tokens, seq.no_repeat_ngram_size);
      tokens.push_back(sample_next(row, seq.tokens, seq.sampling, seq.generator));
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    // HF's ForcedEOSTokenLogitsProcessor: the last allowed token is eos.
    if (config_.forced_eos_token_id && seqs[i]->num_generated() + 1 == seqs[i]->max_new_tokens) {
      tokens[i] = *config_.forced_eos_token_id;
    }
  }
  return tokens;
}

void InferenceEngine::check_stop(Sequence& seq, RequestOutput& out) {
  const int64_t token = seq.tokens.back();
  if (seq.eos_id && token == *seq.eos_id) seq.finish_reason = FinishReason::Stop;
  else if (seq.num_generated() >= seq.max_new_tokens) seq.finish_reason = FinishReason::Length;

  auto it = texts_.find(seq.id);
  if (it == texts_.end()) return;
  TextState& text = *it->second;
  text.text += text.stream.push(token);
  if (seq.finished()) text.text += text.stream.finish();
  for (const auto& stop : seq.stop) {
    // Only the tail can hold a new match: the last token's text plus the stop string's length.
    const size_t from = text.emitted;
    const size_t at = text.text.find(stop, from);
    if (at != std::string::npos) {
      text.text.resize(at);  // OpenAI's convention: the stop string is not returned
      seq.finish_reason = FinishReason::Stop;
    }
  }
  const size_t final_end = seq.finished() ? text.text.size()
                                          : (text.text.size() > text.holdback ? text.text.size() - text.holdback : 0);
  if (final_end > text.emitted) {
    out.new_text += text.text.substr(text.emitted, final_end - text.emitted);
    text.emitted = final_end;
  }
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
  std::vector<int64_t> failed;
  for (size_t i = 0; i < sampled.size(); ++i) {
    Sequence& seq = *sampled[i];
    seq.tokens.push_back(tokens[i]);
    ++generated_tokens_;
    RequestOutput out{.request_id = seq.id, .new_tokens = {tokens[i]}};
    out.prompt_tokens = seq.prompt_len;
    out.generated_tokens = seq.num_generated();
    out.cached_prompt_tokens = seq.num_cached_prefix;
    try {
      check_stop(seq, out);
      out.finished = seq.finished();
      out.finish_reason = seq.finish_reason;
    } catch (const std::exception& e) {
      // This request's own text handling failed: it ends alone, with the
      // error; the others in the batch go on.
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

void InferenceEngine::finish_requests(const std::vector<RequestOutput>& outputs) {
  for (const RequestOutput& out : outputs) {
    if (!out.finished || out.finish_reason == FinishReason::Abort) continue;
    scheduler_->remove(out.request_id);
    texts_.erase(out.request_id);
    if (drafter_) drafter_->release(out.request_id);
  }
}

void InferenceEngine::enable_spec_dec(std::shared_ptr<models::CausalLM> drafter, int64_t n_spec_tokens) {
  TORCH_CHECK(drafter != nullptr, "enable_spec_dec needs a drafter model");
  const int64_t n = n_spec_tokens > 0 ? n_spec_tokens : config_.max_n_spec_tokens;
  if (n < 1) throw ConfigError(fmt::format("n_spec_tokens is {}; a drafter must propose at least 1 token", n));
  const int64_t vocab = models::vocab_size(model_->config()), drafter_vocab = models::vocab_size(drafter->config());
  if (vocab != drafter_vocab) {
    throw ConfigError(fmt::format("the drafter's vocabulary ({} tokens) differs from the model's ({}); speculative "
                                  "decoding needs the same tokenizer",
                                  drafter_vocab, vocab));
  }
  const at::Tensor ours = model_->parameters().front(), theirs = drafter->parameters().front();
  if (ours.device() != theirs.device()) {
    throw ConfigError(fmt::format("the drafter is on {} but the model on {}; put both on one device",
                                  theirs.device().str(), ours.device().str()));
  }
  if (config_.enable_streamingllm) throw ConfigError("speculative decoding does not combine with StreamingLLM");
  if (config_.forced_eos_token_id) throw ConfigError("speculative decoding does not combine with forced_eos_token_id");
  drafter_ = std::make_unique<Drafter>(std::move(drafter), cache_->shape().num_blocks, cache_->block_size());
  n_spec_tokens_ = n;
  config_.use_spec_dec = true;
  config_.max_n_spec_tokens = n;
}

void InferenceEngine::disable_spec_dec() {
  drafter_.reset();
  config_.use_spec_dec = false;
}

void InferenceEngine::add_drafts(std::vector<ScheduledSequence>& batch) {
  std::vector<ScheduledSequence*> items;
  std::vector<Sequence*> seqs;
  std::vector<int64_t> k;
  for (ScheduledSequence& item : batch) {
    Sequence& seq = *item.seq;
    // Decode steps only: one new token, past the prompt, not a beam.
    if (!item.sample || item.num_tokens != 1 || seq.beam || seq.num_generated() < 1) continue;
    // Drafts never take the last allowed token: the target draws that one.
    const int64_t room = seq.max_new_tokens - seq.num_generated() - 1;
    if (room < 1) continue;
    items.push_back(&item);
    seqs.push_back(&seq);
    k.push_back(std::min(n_spec_tokens_, room));
  }
  if (seqs.empty()) return;
  std::vector<Drafter::Proposal> proposals = drafter_->propose(seqs, k);
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& seq = *seqs[i];
    const auto m = static_cast<int64_t>(proposals[i].tokens.size());
    if (m == 0 || !cache_->reserve(seq, 1 + m)) {
      drafter_->rollback(seq, seq.num_computed);
      continue;
    }
    seq.tokens.insert(seq.tokens.end(), proposals[i].tokens.begin(), proposals[i].tokens.end());
    items[i]->num_tokens = 1 + m;
    items[i]->num_drafts = m;
    draft_probs_[seq.id] = std::move(proposals[i].probs);
  }
}

void InferenceEngine::verify_drafts(const ScheduledSequence& item, const at::Tensor& logits,
                                    std::vector<RequestOutput>& outputs) {
  Sequence& seq = *item.seq;
  const int64_t m = item.num_drafts;
  const int64_t base = seq.num_tokens() - m;  // tokens before the drafts
  const std::vector<int64_t> drafts(seq.tokens.end() - m, seq.tokens.end());
  at::Tensor rows = logits.to(at::kFloat).cpu();
  SpecVerdict verdict;
  if (seq.sampling.greedy()) {
    // Keep a draft exactly when it is what plain greedy decoding draws there.
    verdict.accepted = m;
    for (int64_t j = 0; j <= m; ++j) {
      const std::vector<int64_t> context(seq.tokens.begin(), seq.tokens.begin() + base + j);
      const int64_t best = processed_logits(rows[j], context, seq).argmax().item<int64_t>();
      if (j == m || best != drafts[static_cast<size_t>(j)]) {
        verdict = {j, best};
        break;
      }
    }
  } else {
    std::vector<at::Tensor> p;
    for (int64_t j = 0; j <= m; ++j) {
      const std::vector<int64_t> context(seq.tokens.begin(), seq.tokens.begin() + base + j);
      p.push_back(at::softmax(processed_logits(rows[j], context, seq), -1));
    }
    verdict = verify_sampled_drafts(at::stack(p), draft_probs_.at(seq.id), drafts, seq.generator);
  }
  draft_probs_.erase(seq.id);
  draft_tokens_ += m;
  accepted_draft_tokens_ += verdict.accepted;

  // The KV of the accepted drafts stays; what follows them is dropped.
  seq.tokens.resize(static_cast<size_t>(base));
  cache_->truncate(seq, base + verdict.accepted);
  cache_->publish(seq);
  drafter_->rollback(seq, base + verdict.accepted);
  RequestOutput out{.request_id = seq.id};
  std::vector<int64_t> kept(drafts.begin(), drafts.begin() + verdict.accepted);
  kept.push_back(verdict.next_token);
  for (int64_t token : kept) {
    seq.tokens.push_back(token);
    out.new_tokens.push_back(token);
    ++generated_tokens_;
    check_stop(seq, out);
    if (seq.finished()) break;
  }
  out.finished = seq.finished();
  out.finish_reason = seq.finish_reason;
  out.prompt_tokens = seq.prompt_len;
  out.generated_tokens = seq.num_generated();
  out.cached_prompt_tokens = seq.num_cached_prefix;
  outputs.push_back(std::move(out));
}

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
  // Each new beam takes its parent's tokens and (shared) KV blocks; the
  // shared last block is copied when a beam writes into it.
  struct State {
    std::vector<int64_t> tokens;
    std::vector<BlockId> blocks;
    int64_t num_computed, hashed_blocks;
    uint64_t last_hash;
  };
  std::vector<State> states;
  for (size_t i = 0; i < next.parents.size(); ++i) {
    const Sequence& parent = *beams[static_cast<size_t>(next.parents[i])];
    State state{parent.tokens, parent.blocks, parent.num_computed, parent.hashed_blocks, parent.last_hash};
    state.tokens.push_back(next.tokens[i]);
    for (BlockId b : state.blocks) cache_->allocator().retain(b);
    states.push_back(std::move(state));
  }
  for (size_t i = 0; i < states.size(); ++i) {
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
    beam->tokens = std::move(states[i].tokens);
    beam->blocks = std::move(states[i].blocks);
    beam->num_computed = states[i].num_computed;
    beam->hashed_blocks = states[i].hashed_blocks;
    beam->last_hash = states[i].last_hash;
    if (fresh) scheduler_->add_beam(std::move(fresh));
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
