// The workloads bench_inference runs beside batch-1 decode and the throughput
// run (issue 26): batch-B decode, one prompt's prefill (time to first token),
// a ShareGPT-shaped request mix whose prompts open with shared system prompts
// (latencies as vLLM's benchmark reports them), and the kernels of a batch-1
// decode step. Each builds an InferenceEngine over the bench's model and
// returns plain numbers; bench_inference.cpp turns them into rows.
// Header-only: each bench is one translation unit.
#pragma once
#include "bench/kernel_profile.h"
#include "colossus/inference/engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

namespace colossus::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// n token ids drawn uniformly from [1, vocab): 0 is the transformers peer's padding.
inline std::vector<int64_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int64_t> token(1, vocab - 1);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = token(rng);
  return out;
}

// KV blocks a sequence of `tokens` may hold (one spare for the block being filled).
inline int64_t blocks_for(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size + 1; }

// Mean, median and 99th percentile, the percentiles as numpy's (linear interpolation).
struct Summary {
  double mean = 0, p50 = 0, p99 = 0;
};

inline Summary summarize(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const auto at = [&](double p) {
    const double pos = p / 100.0 * static_cast<double>(values.size() - 1);
    const auto lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, values.size() - 1);
    return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
  };
  double sum = 0;
  for (double v : values) sum += v;
  return {sum / static_cast<double>(values.size()), at(50), at(99)};
}

// What every workload's engine shares with the bench's others.
struct EngineBase {
  int64_t block_size = 16;
  bool cuda_graph = false;  // decode steps replayed from CUDA graphs
};

// ---- Batch-B decode -------------------------------------------------------

struct BatchDecode {
  int64_t batch = 0;
  double prefill_ms = 0;      // the step(s) until every request had its first token
  int64_t prefill_steps = 0;  // 1 when one step prefilled all (the token budget allows it)
  double decode_s = 0;
  int64_t decode_tokens = 0;  // drawn after that: batch x (new_tokens - 1)
  double tokens_per_s = 0;
  int64_t graph_steps = 0;  // timed decode steps replayed from CUDA graphs
};

// `batch` requests of prompt_len random tokens and new_tokens outputs
// (ignore_eos) added at once, after a warm-up batch with short outputs (it
// captures the batch's CUDA graph). The steps that prefill all of them are
// timed apart from the decode steps after, which alone give tokens/s.
inline BatchDecode run_batch_decode(const std::shared_ptr<models::CausalLM>& model, const EngineBase& base, int64_t batch,
                                    int64_t prompt_len, int64_t new_tokens, int64_t vocab, uint64_t seed) {
  inference::InferenceConfig ic{.max_batch_size = batch, .max_input_len = prompt_len, .max_output_len = new_tokens,
                                .max_num_batched_tokens = batch * prompt_len, .dtype = "bf16",
                                .block_size = base.block_size,
                                .num_blocks = 2 * batch * blocks_for(prompt_len + new_tokens, base.block_size)};
  ic.use_cuda_graph = base.cuda_graph;
  ic.max_context_len_to_capture = prompt_len + new_tokens;
  inference::InferenceEngine engine(model, nullptr, ic);
  std::mt19937_64 rng(seed);
  const auto add_batch = [&](int64_t tokens) {
    for (int64_t i = 0; i < batch; ++i) {
      engine.add_request(random_tokens(rng, prompt_len, vocab), {.max_new_tokens = tokens, .ignore_eos = true});
    }
  };
  add_batch(std::min<int64_t>(new_tokens, 8));
  while (engine.has_unfinished()) engine.step();

  BatchDecode r{.batch = batch};
  add_batch(new_tokens);
  std::set<int64_t> started;
  auto start = Clock::now();
  while (static_cast<int64_t>(started.size()) < batch) {
    for (const auto& out : engine.step()) {
      if (!out.new_tokens.empty()) started.insert(out.request_id);
    }
    ++r.prefill_steps;
  }
  r.prefill_ms = seconds_since(start) * 1e3;
  const inference::EngineStats before = engine.stats();
  start = Clock::now();
  while (engine.has_unfinished()) engine.step();
  r.decode_s = seconds_since(start);
  const inference::EngineStats after = engine.stats();
  r.decode_tokens = after.generated_tokens - before.generated_tokens;
  r.tokens_per_s = static_cast<double>(r.decode_tokens) / r.decode_s;
  r.graph_steps = after.graph_steps - before.graph_steps;
  return r;
}

// ---- Prefill ----------------------------------------------------------------

struct Prefill {
  int64_t tokens = 0;
  int runs = 0;
  double ttft_ms = 0;  // median over the runs: add_request to the step that drew the token
  double tokens_per_s = 0;
  // CUDA with profiling asked: the kernels of one prefill (Kineto, `runs`
  // more runs), largest first, and their summed device time.
  std::vector<::bench::KernelStat> kernels;
  double kernel_ms = 0;
};

// One request of `tokens` random prompt tokens and max_new_tokens 1, the
// whole prompt one chunk (the step's token budget is the prompt); prefix
// caching off, so every run computes all of it. A warm-up run, then the
// median of `runs`.
inline Prefill run_prefill(const std::shared_ptr<models::CausalLM>& model, const EngineBase& base, int64_t tokens,
                           int64_t vocab, uint64_t seed, int runs = 3, bool profile = false) {
  inference::InferenceConfig ic{.max_batch_size = 1, .max_input_len = tokens, .max_output_len = 1,
                                .max_num_batched_tokens = tokens, .dtype = "bf16", .block_size = base.block_size,
                                .num_blocks = blocks_for(tokens + 1, base.block_size) + 4, .enable_prefix_caching = false};
  inference::InferenceEngine engine(model, nullptr, ic);
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> prompt = random_tokens(rng, tokens, vocab);
  const auto once = [&] {
    const auto start = Clock::now();
    engine.add_request(prompt, {.max_new_tokens = 1, .ignore_eos = true});
    int64_t steps = 0;
    while (engine.has_unfinished()) {
      engine.step();
      ++steps;
    }
    const double seconds = seconds_since(start);
    if (steps != 1) throw std::runtime_error(fmt::format("a {}-token prefill took {} steps, not one", tokens, steps));
    return seconds;
  };
  once();
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) times.push_back(once());
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  Prefill r{.tokens = tokens, .runs = runs, .ttft_ms = median * 1e3, .tokens_per_s = static_cast<double>(tokens) / median};
  if (profile) {
    r.kernels = ::bench::profile_kernels([&] { once(); }, runs);
    for (const auto& k : r.kernels) r.kernel_ms += k.device_ms;
  }
  return r;
}

// FLOPs a prefill of `tokens` tokens must do: 2 per block weight per token,
// the head for the last token only (the engine's logits), and causal
// attention's two T x T / 2 products per layer (2 x 2 x layers x T^2 / 2 x hidden).
inline double prefill_flops(double block_params, double head_params, int64_t layers, int64_t hidden, int64_t tokens) {
  const auto t = static_cast<double>(tokens);
  return 2.0 * block_params * t + 2.0 * head_params + 2.0 * 2.0 * static_cast<double>(layers) * t * t / 2.0 *
                                                          static_cast<double>(hidden);
}

// ---- ShareGPT-shaped request mix ---------------------------------------------

struct MixShape {
  int64_t requests = 1000;
  int64_t system_prompts = 4;  // shared prompt openings
  int64_t system_len = 128;    // tokens of each
  int64_t min_input = 4, max_input = 1024, min_output = 4, max_output = 1024;
  uint64_t seed = 0;
};

struct MixRequest {
  std::vector<int64_t> prompt;
  int64_t new_tokens = 0;
};

// bench/serve_bench.py's request mix: lognormal lengths, the prompt's with
// median 160 tokens (sigma 0.8), the output's median 190 (sigma 0.7),
// clipped to [min, max] (the same distribution as its numpy draws, not the
// same draws). Each prompt here opens with one of `system_prompts` seeded
// system prompts of system_len tokens (chosen uniformly), so prefix caching
// has something to reuse; the lognormal part follows it.
inline std::vector<MixRequest> sharegpt_mix(const MixShape& shape, int64_t vocab) {
  std::mt19937_64 rng(shape.seed);
  std::vector<std::vector<int64_t>> systems;
  for (int64_t i = 0; i < shape.system_prompts; ++i) systems.push_back(random_tokens(rng, shape.system_len, vocab));
  std::lognormal_distribution<double> input(std::log(160.0), 0.8), output(std::log(190.0), 0.7);
  std::uniform_int_distribution<int64_t> which(0, shape.system_prompts - 1);
  std::vector<MixRequest> out;
  for (int64_t i = 0; i < shape.requests; ++i) {
    const int64_t user = std::clamp<int64_t>(std::llround(input(rng)), shape.min_input, shape.max_input);
    MixRequest r;
    r.new_tokens = std::clamp<int64_t>(std::llround(output(rng)), shape.min_output, shape.max_output);
    r.prompt = systems[static_cast<size_t>(which(rng))];
    const std::vector<int64_t> rest = random_tokens(rng, user, vocab);
    r.prompt.insert(r.prompt.end(), rest.begin(), rest.end());
    out.push_back(std::move(r));
  }
  return out;
}

struct MixResult {
  double seconds = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double output_tokens_per_s = 0, total_tokens_per_s = 0;  // total: prompt + output tokens
  Summary ttft_ms, tpot_ms;
  inference::EngineStats stats;  // of the timed run (warm-up subtracted)
  int64_t cached_prompt_tokens = 0;  // reused from the prefix cache
};

// Every request added at t = 0 to an engine of `config`, run to the end.
// TTFT: from the start to the step that returned a request's first token;
// TPOT: (end-to-end - TTFT) / (outputs - 1), as vLLM's benchmark. Before
// that, a warm-up of max_batch_size short fresh requests whose outputs end
// at staggered steps, so the batch halves from max_batch_size to 1 and
// every CUDA-graph bucket (powers of two) is captured outside the timed run.
inline MixResult run_mix(const std::shared_ptr<models::CausalLM>& model, const inference::InferenceConfig& config,
                         const std::vector<MixRequest>& requests, int64_t vocab, uint64_t seed) {
  inference::InferenceEngine engine(model, nullptr, config);
  std::mt19937_64 rng(seed);
  const int64_t width = config.max_batch_size;
  const auto levels = static_cast<int64_t>(std::bit_width(static_cast<uint64_t>(width)));
  for (int64_t i = 0; i < width; ++i) {
    // Request i stops after 2 + levels - bit_width(i) tokens: half the batch leaves each step.
    const auto tokens = std::min<int64_t>(2 + levels - static_cast<int64_t>(std::bit_width(static_cast<uint64_t>(i))),
                                          config.max_output_len);
    engine.add_request(random_tokens(rng, std::min<int64_t>(16, config.max_input_len), vocab),
                       {.max_new_tokens = tokens, .ignore_eos = true});
  }
  while (engine.has_unfinished()) engine.step();
  const inference::EngineStats warm = engine.stats();

  MixResult r;
  const size_t n = requests.size();
  std::vector<double> first(n, -1), end(n, -1);
  std::map<int64_t, size_t> index;  // request id -> requests[i]
  const auto start = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    index[engine.add_request(requests[i].prompt, {.max_new_tokens = requests[i].new_tokens, .ignore_eos = true})] = i;
    r.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
    r.output_tokens += requests[i].new_tokens;
  }
  while (engine.has_unfinished()) {
    const std::vector<inference::RequestOutput> outputs = engine.step();
    const double now = seconds_since(start);
    for (const auto& out : outputs) {
      const size_t i = index.at(out.request_id);
      if (first[i] < 0 && !out.new_tokens.empty()) first[i] = now;
      if (!out.finished) continue;
      if (out.error || out.generated_tokens != requests[i].new_tokens) {
        throw std::runtime_error(fmt::format("mix request {} ended with {} of {} tokens{}", i, out.generated_tokens,
                                             requests[i].new_tokens, out.error ? ": " + *out.error : std::string()));
      }
      end[i] = now;
      r.cached_prompt_tokens += out.cached_prompt_tokens;
    }
  }
  r.seconds = seconds_since(start);
  std::vector<double> ttft, tpot;
  for (size_t i = 0; i < n; ++i) {
    ttft.push_back(first[i] * 1e3);
    if (requests[i].new_tokens > 1) tpot.push_back((end[i] - first[i]) * 1e3 / static_cast<double>(requests[i].new_tokens - 1));
  }
  r.ttft_ms = summarize(ttft);
  r.tpot_ms = summarize(tpot);
  r.output_tokens_per_s = static_cast<double>(r.output_tokens) / r.seconds;
  r.total_tokens_per_s = static_cast<double>(r.prompt_tokens + r.output_tokens) / r.seconds;
  r.stats = engine.stats();
  r.stats.steps -= warm.steps;
  r.stats.prompt_tokens -= warm.prompt_tokens;
  r.stats.generated_tokens -= warm.generated_tokens;
  r.stats.preemptions -= warm.preemptions;
  r.stats.prefix_cache_queries -= warm.prefix_cache_queries;
  r.stats.prefix_cache_hits -= warm.prefix_cache_hits;
  r.stats.graph_steps -= warm.graph_steps;
  return r;
}

// ---- Kernel breakdown of batch-1 decode ----------------------------------------

struct DecodeProfile {
  int steps = 0;
  double wall_ms_per_step = 0;    // host clock, unprofiled steps
  double kernel_ms_per_step = 0;  // device time of every kernel and copy, summed
  int64_t graph_steps = 0;        // of the profiled steps, replayed from CUDA graphs
  std::vector<::bench::KernelStat> kernels;  // per step, largest first
};

// One request decoding alone (an engine like the batch-1 run's): after the
// prefill and 3 decode steps (graph captured), `steps` decode steps timed on
// the host clock, then `steps` more under Kineto. CUDA only.
inline DecodeProfile profile_decode(const std::shared_ptr<models::CausalLM>& model, const EngineBase& base,
                                    const std::vector<int64_t>& prompt, int steps) {
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  const int64_t new_tokens = 2 * steps + 8;  // the request outlives every step below
  inference::InferenceConfig ic{.max_batch_size = 1, .max_input_len = prompt_len, .max_output_len = new_tokens,
                                .dtype = "bf16", .block_size = base.block_size,
                                .num_blocks = 4 * blocks_for(prompt_len + new_tokens, base.block_size)};
  ic.use_cuda_graph = base.cuda_graph;
  ic.max_context_len_to_capture = prompt_len + new_tokens;
  inference::InferenceEngine engine(model, nullptr, ic);
  engine.add_request(prompt, {.max_new_tokens = new_tokens, .ignore_eos = true});
  for (int i = 0; i < 4; ++i) engine.step();
  DecodeProfile p{.steps = steps};
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) engine.step();
  p.wall_ms_per_step = seconds_since(start) * 1e3 / steps;
  const int64_t graphs_before = engine.stats().graph_steps;
  p.kernels = ::bench::profile_kernels([&] { engine.step(); }, steps);
  p.graph_steps = engine.stats().graph_steps - graphs_before;
  for (const auto& k : p.kernels) p.kernel_ms_per_step += k.device_ms;
  while (engine.has_unfinished()) engine.step();
  return p;
}

}  // namespace colossus::bench
