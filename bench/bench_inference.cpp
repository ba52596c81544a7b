// Inference on one GPU (issue 8's acceptance benchmark): a llama-1b-like model
// (hidden 2048, 16 layers, 32 query / 8 KV heads of 64, SwiGLU 8192, vocab
// 32000, untied head: 1.10B parameters) with seeded random bf16 weights, run by
// InferenceEngine (paged KV cache, CUDA paged-attention kernels, continuous
// batching), against
//   (a) the HBM roofline of batch-1 decode: the bytes a decode step must read
//       (every weight but the embedding table, plus the average K/V of the
//       context) at the device-to-device copy bandwidth measured in this run;
//   (b) transformers' generate on the same weights (saved as a HF directory,
//       loaded by bench/bench_inference.py in a subprocess; bf16, sdpa,
//       greedy): batch-1 decode tokens/s, and the agreeing prefix of the
//       greedy tokens (a sanity check: the first --check-tokens must agree);
//   (c) throughput on --requests mixed requests (prompt and output lengths
//       uniform in ranges, seeded): ours all added at once, theirs in
//       left-padded batches of --peer-batch (no continuous batching in HF).
// With --cuda-graph on (the default) both are measured again with the
// engine's use_cuda_graph (decode steps replayed from captured graphs); an
// engine that refuses it leaves a note in place of those rows.
// Batch-1 decode is timed over the decode steps only (the prefill step is
// timed on its own) after a warm-up request; every engine step ends with a
// device-to-host copy of the drawn tokens, so the host clock is exact.
// Prints a table; appends to bench/RESULTS.md and bench/results.jsonl (and,
// with --out-dir, writes the same section and rows there too).
//
// Usage: bench_inference [--device cuda|cpu] [--tiny] [model shape flags]
//          [--prompt-len 128] [--new-tokens 256] [--requests 256] ...
//          [--python PATH | --no-python] [--out-dir DIR] [--commit SHA] [--no-record]
// (bench_inference --help lists every flag.) --device cpu --tiny is a smoke
// test of the whole flow; it never records.
#include "bench/bench_common.h"
#include "colossus/core/errors.h"
#include "colossus/inference/engine/engine.h"
#include "colossus/models/pretrained.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/headeronly/version.h>
#ifdef BENCH_INFERENCE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace bench = colossus::bench;
namespace models = colossus::models;
namespace inference = colossus::inference;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string device = "cuda";
  bool tiny = false;
  int64_t hidden = 2048, layers = 16, heads = 32, kv_heads = 8, intermediate = 8192, vocab = 32000;
  int64_t prompt_len = 128, new_tokens = 256;
  int64_t requests = 256, prompt_min = 32, prompt_max = 512, output_min = 32, output_max = 256;
  int64_t max_batch_size = 256, max_num_batched_tokens = 8192, block_size = 16;
  int64_t check_tokens = 8;
  uint64_t seed = 0;
  std::string python;
  bool no_python = false;
  std::string peer_variants = "dynamic,static";
  int64_t peer_batch = 64;
  double peer_max_seconds = 60;
  int peer_timeout_s = 240;
  std::string workdir = "/tmp/bench_inference";
  std::string out_dir, commit;
  bool no_record = false;
  std::string cuda_graph = "on";
  std::string command = "bench_inference";
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void sync(const c10::Device& device) {
  if (device.is_cuda()) at::accelerator::synchronizeDevice(device.index());
}

// Device-to-device copy bandwidth, bytes read + written per second.
double copy_bandwidth(const c10::Device& device) {
  const int64_t bytes = device.is_cuda() ? int64_t{2} << 30 : int64_t{256} << 20;
  at::Tensor src = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  at::Tensor dst = at::empty_like(src);
  src.fill_(1);
  for (int i = 0; i < 3; ++i) dst.copy_(src);
  sync(device);
  const int iters = device.is_cuda() ? 20 : 5;
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) dst.copy_(src);
  sync(device);
  return 2.0 * static_cast<double>(bytes) * iters / seconds_since(start);
}

std::vector<int64_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int64_t> token(1, vocab - 1);  // 0 is the peer's padding
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = token(rng);
  return out;
}

struct Request {
  std::vector<int64_t> prompt;
  int64_t new_tokens = 0;
};

struct DecodeResult {
  double prefill_ms = 0, decode_s = 0, tokens_per_s = 0;
  std::vector<int64_t> tokens;
};

// One request through the engine step by step: the first step is the prefill
// (it draws the first token), the others decode one token each.
DecodeResult run_single(inference::InferenceEngine& engine, const std::vector<int64_t>& prompt, int64_t new_tokens) {
  DecodeResult r;
  engine.add_request(prompt, {.max_new_tokens = new_tokens, .ignore_eos = true});
  auto start = Clock::now();
  bool first = true;
  while (engine.has_unfinished()) {
    for (const auto& out : engine.step()) r.tokens.insert(r.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    if (first) {
      r.prefill_ms = seconds_since(start) * 1e3;
      start = Clock::now();
      first = false;
    }
  }
  r.decode_s = seconds_since(start);
  r.tokens_per_s = static_cast<double>(new_tokens - 1) / r.decode_s;
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  Config cfg;
  CLI::App app{"bench_inference: InferenceEngine decode and throughput against the HBM roofline and transformers"};
  app.add_option("--device", cfg.device, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_flag("--tiny", cfg.tiny, "a tiny model and workload (smoke test; never records)");
  app.add_option("--hidden", cfg.hidden, "hidden size");
  app.add_option("--layers", cfg.layers, "decoder layers");
  app.add_option("--heads", cfg.heads, "query heads");
  app.add_option("--kv-heads", cfg.kv_heads, "KV heads");
  app.add_option("--intermediate", cfg.intermediate, "SwiGLU width");
  app.add_option("--vocab", cfg.vocab, "vocabulary size");
  app.add_option("--prompt-len", cfg.prompt_len, "batch-1 decode: prompt tokens");
  app.add_option("--new-tokens", cfg.new_tokens, "batch-1 decode: generated tokens");
  app.add_option("--requests", cfg.requests, "throughput: requests");
  app.add_option("--prompt-min", cfg.prompt_min, "throughput: shortest prompt");
  app.add_option("--prompt-max", cfg.prompt_max, "throughput: longest prompt");
  app.add_option("--output-min", cfg.output_min, "throughput: fewest new tokens");
  app.add_option("--output-max", cfg.output_max, "throughput: most new tokens");
  app.add_option("--max-batch-size", cfg.max_batch_size, "engine: sequences per step");
  app.add_option("--max-num-batched-tokens", cfg.max_num_batched_tokens, "engine: tokens per step");
  app.add_option("--block-size", cfg.block_size, "engine: tokens per KV block");
  app.add_option("--cuda-graph", cfg.cuda_graph,
                 "on: also measure with use_cuda_graph (skipped with a note if the engine refuses it); off")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--check-tokens", cfg.check_tokens, "leading greedy tokens that must agree with transformers");
  app.add_option("--seed", cfg.seed, "weights and requests");
  app.add_option("--python", cfg.python, "python with torch + transformers (default: .venv/bin/python or python3)");
  app.add_flag("--no-python", cfg.no_python, "skip the transformers peer");
  app.add_option("--peer-variants", cfg.peer_variants, "decode peers: dynamic,static,compile");
  app.add_option("--peer-batch", cfg.peer_batch, "transformers throughput batch");
  app.add_option("--peer-max-seconds", cfg.peer_max_seconds, "transformers throughput: start no batch after this");
  app.add_option("--peer-timeout", cfg.peer_timeout_s, "seconds before the peer process is killed");
  app.add_option("--workdir", cfg.workdir, "where the HF model directory and the requests go");
  app.add_option("--out-dir", cfg.out_dir, "also write the RESULTS.md section and JSONL rows here");
  app.add_option("--commit", cfg.commit, "commit to record (default: git HEAD)");
  app.add_flag("--no-record", cfg.no_record, "do not append to bench/RESULTS.md and bench/results.jsonl");
  CLI11_PARSE(app, argc, argv);
  for (int i = 1; i < argc; ++i) cfg.command += std::string(" ") + argv[i];
  if (cfg.tiny) {
    cfg.hidden = 64, cfg.layers = 2, cfg.heads = 4, cfg.kv_heads = 2, cfg.intermediate = 128, cfg.vocab = 1000;
    cfg.prompt_len = 16, cfg.new_tokens = 24, cfg.requests = 12, cfg.prompt_min = 4, cfg.prompt_max = 40;
    cfg.output_min = 4, cfg.output_max = 20, cfg.max_batch_size = 8, cfg.max_num_batched_tokens = 64;
    cfg.peer_batch = 4, cfg.no_record = true;
  }
  const c10::Device device = cfg.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (device.is_cuda() && !at::hasCUDA()) throw std::runtime_error("no CUDA device (use --device cpu --tiny)");
  if (cfg.prompt_min < 1 || cfg.prompt_max < cfg.prompt_min || cfg.output_min < 1 || cfg.output_max < cfg.output_min ||
      cfg.new_tokens < 2 || cfg.prompt_len < 1 || cfg.requests < 1) {
    throw std::runtime_error("bad lengths: need 1 <= min <= max, --new-tokens >= 2, --prompt-len >= 1, --requests >= 1");
  }
  const auto t_start = Clock::now();

  // The model, and its HF directory for the peer.
  models::LlamaConfig mc;
  mc.vocab_size = cfg.vocab, mc.hidden_size = cfg.hidden, mc.intermediate_size = cfg.intermediate;
  mc.num_hidden_layers = cfg.layers, mc.num_attention_heads = cfg.heads, mc.num_key_value_heads = cfg.kv_heads;
  mc.max_position_embeddings = std::max<int64_t>(2048, std::max(cfg.prompt_len + cfg.new_tokens, cfg.prompt_max + cfg.output_max));
  mc.rms_norm_eps = 1e-5, mc.rope_theta = 10000.0;
  auto model = models::create_model(mc, {.seed = cfg.seed, .dtype = at::kBFloat16, .device = device});
  double param_bytes = 0, embed_bytes = 0;
  for (const auto& p : model->parameters()) param_bytes += static_cast<double>(p.nbytes());
  embed_bytes = static_cast<double>(model->embedding().weight.nbytes());
  const double params = param_bytes / 2;
  // A decode step reads every weight once, except the embedding table (one row).
  const double weight_bytes = param_bytes - embed_bytes + static_cast<double>(cfg.hidden * 2);
  const fs::path workdir(cfg.workdir), model_dir = workdir / "model";
  fs::create_directories(workdir);
  const bool peer = !cfg.no_python;
  if (peer) models::save_pretrained(*model, model_dir.string());

  const double bandwidth = copy_bandwidth(device);
  const int64_t head_dim = cfg.hidden / cfg.heads;
  const double kv_bytes_per_token = 2.0 * static_cast<double>(cfg.layers * cfg.kv_heads * head_dim) * 2;  // K+V, bf16
  // Decode step i (1..N-1) attends to prompt_len + i cached tokens.
  const double avg_context = static_cast<double>(cfg.prompt_len) + static_cast<double>(cfg.new_tokens) / 2.0;
  const double step_bytes = weight_bytes + kv_bytes_per_token * avg_context;
  const double roofline_tps = bandwidth / step_bytes;
  fmt::print("llama-1b-like: {:.3f}B params, {:.2f} GB read per decode token ({:.2f} GB weights + {:.1f} MB KV); "
             "copy bandwidth {:.0f} GB/s -> roofline {:.0f} tokens/s\n",
             params / 1e9, step_bytes / 1e9, weight_bytes / 1e9, kv_bytes_per_token * avg_context / 1e6,
             bandwidth / 1e9, roofline_tps);

  // Requests.
  std::mt19937_64 rng(cfg.seed + 1);
  const std::vector<int64_t> prompt = random_tokens(rng, cfg.prompt_len, cfg.vocab);
  const std::vector<int64_t> warmup_prompt = random_tokens(rng, cfg.prompt_len, cfg.vocab);
  std::vector<Request> requests;
  std::uniform_int_distribution<int64_t> prompt_len(cfg.prompt_min, cfg.prompt_max), out_len(cfg.output_min, cfg.output_max);
  int64_t requested_tokens = 0;
  for (int64_t i = 0; i < cfg.requests; ++i) {
    Request r;
    r.prompt = random_tokens(rng, prompt_len(rng), cfg.vocab);
    r.new_tokens = out_len(rng);
    requested_tokens += r.new_tokens;
    requests.push_back(std::move(r));
  }

  // (a) Batch-1 decode.
  const auto blocks_for = [&](int64_t tokens) { return (tokens + cfg.block_size - 1) / cfg.block_size + 1; };
  // Eagerly, then (--cuda-graph on) with decode steps replayed from CUDA graphs
  // (an engine that refuses them, e.g. on CPU, leaves a note instead).
  const bool try_graphs = cfg.cuda_graph == "on";
  std::vector<std::string> graph_notes;
  const auto run_decode = [&](bool graphs) -> std::optional<DecodeResult> {
    inference::InferenceConfig ic{.max_batch_size = 1, .max_input_len = cfg.prompt_len, .max_output_len = cfg.new_tokens,
                                  .dtype = "bf16", .block_size = cfg.block_size,
                                  .num_blocks = 4 * blocks_for(cfg.prompt_len + cfg.new_tokens)};
    ic.use_cuda_graph = graphs;
    ic.max_context_len_to_capture = cfg.prompt_len + cfg.new_tokens;
    std::unique_ptr<inference::InferenceEngine> engine;
    try {
      engine = std::make_unique<inference::InferenceEngine>(model, nullptr, ic);
    } catch (const colossus::ConfigError& e) {
      if (!graphs) throw;
      graph_notes.push_back(fmt::format("CUDA graphs not measured: {}", e.what()));
      return std::nullopt;
    }
    try {
      run_single(*engine, warmup_prompt, cfg.new_tokens);
      return run_single(*engine, prompt, cfg.new_tokens);
    } catch (const std::exception& e) {
      if (!graphs) throw;
      // A failed capture or replay costs the graph rows, not the run.
      graph_notes.push_back(fmt::format("CUDA graphs failed on the batch-1 run: {}", e.what()));
      return std::nullopt;
    }
  };
  const DecodeResult ours = *run_decode(false);
  fmt::print("colossus batch-1: prefill {:.1f} ms ({} tokens), decode {:.1f} tokens/s ({:.2f} ms/token)\n", ours.prefill_ms,
             cfg.prompt_len, ours.tokens_per_s, 1e3 / ours.tokens_per_s);
  std::fflush(stdout);
  std::optional<DecodeResult> ours_graph;
  if (try_graphs) {
    ours_graph = run_decode(true);
    if (ours_graph) {
      fmt::print("colossus batch-1, CUDA graphs: prefill {:.1f} ms, decode {:.1f} tokens/s ({:.2f} ms/token); tokens {} "
                 "the eager run's\n",
                 ours_graph->prefill_ms, ours_graph->tokens_per_s, 1e3 / ours_graph->tokens_per_s,
                 ours_graph->tokens == ours.tokens ? "equal" : "DIFFER from");
      graph_notes.push_back(fmt::format("CUDA graphs, batch-1: prefill {:.1f} ms, decode {:.2f} ms/token, greedy tokens {} the "
                                        "eager run's",
                                        ours_graph->prefill_ms, 1e3 / ours_graph->tokens_per_s,
                                        ours_graph->tokens == ours.tokens ? "equal to" : "DIFFERENT from"));
    } else {
      fmt::print("{}\n", graph_notes.back());
    }
    std::fflush(stdout);
  }

  // (c) Throughput: every request added at once.
  struct Throughput {
    double seconds = 0, tokens_per_s = 0;
    inference::EngineStats stats;
  };
  const auto run_throughput = [&](bool graphs) -> std::optional<Throughput> {
    inference::InferenceConfig ic{.max_batch_size = cfg.max_batch_size, .max_input_len = cfg.prompt_max,
                                  .max_output_len = cfg.output_max, .max_num_batched_tokens = cfg.max_num_batched_tokens,
                                  .dtype = "bf16", .block_size = cfg.block_size,
                                  .num_blocks = cfg.max_batch_size * blocks_for(cfg.prompt_max + cfg.output_max) + 64};
    ic.use_cuda_graph = graphs;
    ic.max_context_len_to_capture = cfg.prompt_max + cfg.output_max;
    std::unique_ptr<inference::InferenceEngine> engine;
    try {
      engine = std::make_unique<inference::InferenceEngine>(model, nullptr, ic);
    } catch (const colossus::ConfigError& e) {
      if (!graphs) throw;
      graph_notes.push_back(fmt::format("CUDA graphs not measured on the throughput run: {}", e.what()));
      return std::nullopt;
    }
    // Warm-up: a few short requests (kernels, allocator); fresh prompts, so
    // that the prefix cache holds none of the measured ones.
    std::mt19937_64 warm_rng(cfg.seed + 2);
    for (int i = 0; i < 8; ++i) {
      engine->add_request(random_tokens(warm_rng, cfg.prompt_max, cfg.vocab),
                          {.max_new_tokens = std::min<int64_t>(8, cfg.output_max), .ignore_eos = true});
    }
    while (engine->has_unfinished()) engine->step();
    const auto warm = engine->stats();
    Throughput t;
    const auto start = Clock::now();
    for (const Request& r : requests) engine->add_request(r.prompt, {.max_new_tokens = r.new_tokens, .ignore_eos = true});
    while (engine->has_unfinished()) engine->step();
    t.seconds = seconds_since(start);
    t.stats = engine->stats();
    t.stats.generated_tokens -= warm.generated_tokens;
    t.stats.steps -= warm.steps;
    t.stats.prompt_tokens -= warm.prompt_tokens;
    t.stats.preemptions -= warm.preemptions;
    if (t.stats.generated_tokens != requested_tokens) {
      throw std::runtime_error(fmt::format("the engine generated {} tokens; the requests asked for {}",
                                           t.stats.generated_tokens, requested_tokens));
    }
    t.tokens_per_s = static_cast<double>(requested_tokens) / t.seconds;
    fmt::print("colossus throughput{}: {} requests, {} generated tokens in {:.2f} s = {:.0f} tokens/s ({} steps, {} "
               "preemptions)\n",
               graphs ? ", CUDA graphs" : "", cfg.requests, requested_tokens, t.seconds, t.tokens_per_s, t.stats.steps,
               t.stats.preemptions);
    std::fflush(stdout);
    return t;
  };
  const Throughput through = *run_throughput(false);
  const double through_s = through.seconds, through_tps = through.tokens_per_s;
  const inference::EngineStats through_stats = through.stats;
  std::optional<Throughput> through_graph;
  if (try_graphs && ours_graph) {
    try {
      through_graph = run_throughput(true);
    } catch (const std::exception& e) {
      graph_notes.push_back(fmt::format("CUDA graphs failed on the throughput run: {}", e.what()));
      fmt::print("{}\n", graph_notes.back());
    }
  }
  model.reset();
  if (device.is_cuda()) at::accelerator::emptyCache();  // the peer's process gets the card

  // (b) The transformers peer.
  json peer_result;
  const fs::path repo = bench::repo_root();
  if (peer) {
    json spec{{"decode", {{"prompt", prompt}, {"warmup_prompt", warmup_prompt}, {"new_tokens", cfg.new_tokens}}},
              {"throughput", json::array()}};
    for (const Request& r : requests) spec["throughput"].push_back({{"prompt", r.prompt}, {"new_tokens", r.new_tokens}});
    const fs::path spec_path = workdir / "requests.json";
    std::ofstream(spec_path) << spec.dump();
    std::string python = cfg.python;
    if (python.empty()) python = fs::exists(repo / ".venv/bin/python") ? (repo / ".venv/bin/python").string() : "python3";
    const std::string out = bench::run_command(fmt::format(
        "timeout {} '{}' '{}' --model '{}' --requests '{}' --device {} --variants {} --batch {} --max-seconds {}",
        cfg.peer_timeout_s, python, (repo / "bench/bench_inference.py").string(), model_dir.string(), spec_path.string(),
        cfg.device, cfg.peer_variants, cfg.peer_batch, cfg.peer_max_seconds));
    const size_t brace = out.rfind("\n{");
    try {
      peer_result = json::parse(out.substr(brace == std::string::npos ? 0 : brace + 1));
    } catch (const std::exception& e) {
      fmt::print(stderr, "the transformers peer gave no result ({}); its output:\n{}\n", e.what(), out);
    }
  }

  // The table.
  std::string best_variant;
  double peer_decode = 0;
  if (peer_result.contains("decode")) {
    for (const auto& [variant, row] : peer_result["decode"].items()) {
      if (row["decode_tokens_per_s"].get<double>() > peer_decode) {
        peer_decode = row["decode_tokens_per_s"].get<double>();
        best_variant = variant;
      }
    }
  }
  int64_t agree = -1;  // leading greedy tokens equal to the peer's (dynamic cache)
  if (peer_result.contains("decode") && peer_result["decode"].contains("dynamic")) {
    const auto theirs = peer_result["decode"]["dynamic"]["tokens"].get<std::vector<int64_t>>();
    agree = 0;
    while (agree < static_cast<int64_t>(std::min(theirs.size(), ours.tokens.size())) && theirs[agree] == ours.tokens[agree]) ++agree;
  }
  const int64_t need = std::min(cfg.check_tokens, cfg.new_tokens);
  const bool check_ok = agree < 0 || agree >= need;
  const json* peer_tp = peer_result.contains("throughput") ? &peer_result["throughput"] : nullptr;
  const double peer_tps = peer_tp ? peer_tp->at("tokens_per_s").get<double>() : 0;

  const std::string decode_workload = fmt::format("batch-1 decode, prompt {}, {} new tokens (greedy)", cfg.prompt_len, cfg.new_tokens);
  const std::string through_workload = fmt::format("{} requests, prompt {}-{}, output {}-{} tokens", cfg.requests, cfg.prompt_min,
                                                   cfg.prompt_max, cfg.output_min, cfg.output_max);
  struct Row {
    std::string workload, impl, metric;
    double value;
    std::string peer;
    double peer_value;
  };
  const std::string eager = "colossus InferenceEngine, eager";
  const std::string graphed = "colossus InferenceEngine, CUDA graphs (use_cuda_graph)";
  const std::string roofline_peer = fmt::format(
      "HBM roofline: {:.3f} GB/token (weights {:.3f} + KV {:.1f} MB at mean context {:.0f}) at copy bandwidth {:.0f} GB/s",
      step_bytes / 1e9, weight_bytes / 1e9, kv_bytes_per_token * avg_context / 1e6, avg_context, bandwidth / 1e9);
  const auto hf_decode = [&](const std::string& variant) {
    return fmt::format("transformers generate, {} cache{}, sdpa, bf16 (prefill {:.1f} ms)", variant,
                       variant == "compile" ? " + torch.compile" : "",
                       peer_result["decode"][variant]["prefill_ms"].get<double>());
  };
  std::vector<Row> rows;
  rows.push_back({decode_workload, eager, "decode_tokens_per_s", ours.tokens_per_s, roofline_peer, roofline_tps});
  if (peer_result.contains("decode")) {
    for (const auto& [variant, row] : peer_result["decode"].items()) {
      rows.push_back({decode_workload, eager, "decode_tokens_per_s", ours.tokens_per_s, hf_decode(variant),
                      row["decode_tokens_per_s"].get<double>()});
    }
  }
  if (ours_graph) {
    rows.push_back({decode_workload, graphed, "decode_tokens_per_s", ours_graph->tokens_per_s, roofline_peer, roofline_tps});
    if (!best_variant.empty()) {
      rows.push_back({decode_workload, graphed, "decode_tokens_per_s", ours_graph->tokens_per_s, hf_decode(best_variant),
                      peer_decode});
    }
  }
  const std::string hf_through =
      peer_tp ? fmt::format("transformers generate, left-padded batches of {}, each to its longest output (no continuous "
                            "batching; tokens counted as requested), dynamic cache{}",
                            peer_tp->at("batch").get<int64_t>(),
                            peer_tp->at("requests") == peer_tp->at("of")
                                ? std::string()
                                : fmt::format("; capped: first {} of {} requests", peer_tp->at("requests").get<int64_t>(),
                                              peer_tp->at("of").get<int64_t>()))
              : "none (no peer result)";
  rows.push_back({through_workload, eager, "throughput_tokens_per_s", through_tps, hf_through, peer_tps});
  if (through_graph) {
    rows.push_back({through_workload, graphed, "throughput_tokens_per_s", through_graph->tokens_per_s, hf_through, peer_tps});
  }
  std::vector<std::string> lines = {"| workload | colossus | tok/s | peer | peer tok/s | colossus / peer |",
                                    "|---|---|---|---|---|---|"};
  for (const Row& r : rows) {
    lines.push_back(fmt::format("| {} | {} | {:.1f} | {} | {:.1f} | {} |", r.workload, r.impl, r.value, r.peer, r.peer_value,
                                r.peer_value > 0 ? fmt::format("{:.2f}", r.value / r.peer_value) : "-"));
  }
  std::string notes = fmt::format(
      "colossus batch-1: prefill {:.1f} ms, decode {:.2f} ms/token ({:.0f}% of the HBM roofline). colossus throughput: "
      "{} steps, {} prompt tokens prefilled, {} generated in {:.2f} s, {} preemptions. greedy agreement with transformers "
      "(dynamic cache): first {} of {} tokens (check: first {} must agree: {}).{}",
      ours.prefill_ms, 1e3 / ours.tokens_per_s, 100.0 * ours.tokens_per_s / roofline_tps, through_stats.steps,
      through_stats.prompt_tokens, requested_tokens, through_s, through_stats.preemptions,
      agree < 0 ? std::string("n/a") : std::to_string(agree), cfg.new_tokens, need,
      agree < 0 ? "not run" : (check_ok ? "PASS" : "FAIL"),
      peer_tp ? fmt::format(" transformers throughput: {} requests, {} tokens in {:.1f} s.", peer_tp->at("requests").get<int64_t>(),
                            peer_tp->at("generated_tokens").get<int64_t>(), peer_tp->at("seconds").get<double>())
              : std::string());
  for (const auto& n : graph_notes) notes += " " + n + ".";
  if (through_graph) {
    notes += fmt::format(" CUDA graphs, throughput: {} steps in {:.2f} s; each batch-size bucket's graph is captured on "
                         "first use, inside the timed run.",
                         through_graph->stats.steps, through_graph->seconds);
  }

  // Machine, date, commit.
  std::string machine = bench::machine_name(false);
#ifdef BENCH_INFERENCE_CUDA
  if (device.is_cuda()) {
    const auto* prop = at::cuda::getCurrentDeviceProperties();
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    machine = fmt::format("1x {} ({} SMs, {:.0f} GiB), driver CUDA {}.{}, runtime {}.{}", prop->name, prop->multiProcessorCount,
                          static_cast<double>(prop->totalGlobalMem) / (1 << 30), driver / 1000, driver % 1000 / 10,
                          runtime / 1000, runtime % 1000 / 10);
  }
#endif
  const std::string commit = bench::commit_or(cfg.commit, repo, "unknown (pass --commit)");
  const std::string date = bench::today(bench::kDateTimeUtc);
  const std::string config = fmt::format(
      "llama-1b-like: hidden {}, {} layers, {} query / {} KV heads of {}, SwiGLU {}, vocab {}, untied head ({:.3f}B params), "
      "seeded random weights (seed {}), bf16; engine: paged KV cache (block {}), {}, greedy, "
      "ignore_eos; throughput engine max_batch_size {}, max_num_batched_tokens {}; peer: transformers {} (torch {}) on the "
      "same weights (save_pretrained -> from_pretrained)",
      cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, head_dim, cfg.intermediate, cfg.vocab, params / 1e9, cfg.seed,
      cfg.block_size, device.is_cuda() ? "CUDA paged-attention kernels" : "reference attention (CPU)", cfg.max_batch_size, cfg.max_num_batched_tokens, peer_result.is_object() ? peer_result.value("transformers", std::string("-")) : "-",
      peer_result.is_object() ? peer_result.value("torch", std::string("-")) : "-");

  fmt::print("\n{}\n\n", config);
  for (const auto& l : lines) fmt::print("{}\n", l);
  fmt::print("\n{}\n", notes);
  fmt::print("bench_inference: {:.0f} s in all\n", seconds_since(t_start));

  std::string section = fmt::format("\n## inference — {}\n\nmachine: {}; commit {}; torch {}\ncommand: `{}`\nconfig: {}\n\n", date,
                                    machine, commit, TORCH_VERSION, cfg.command, config);
  for (const auto& l : lines) section += l + "\n";
  section += "\n" + notes + "\n";
  std::string jsonl;
  for (const Row& r : rows) {
    jsonl += json{{"date", date},         {"commit", commit},          {"machine", machine},
                  {"bench", "inference"}, {"config", config},          {"workload", r.workload}, {"impl", r.impl},
                  {"metric", r.metric},   {"value", r.value},          {"peer", r.peer},
                  {"peer_value", r.peer_value}, {"ratio", r.peer_value > 0 ? r.value / r.peer_value : 0.0},
                  {"greedy_agreement", agree}}
                 .dump() +
             "\n";
  }
  const auto append = bench::append_file;
  if (!cfg.out_dir.empty()) {
    fs::create_directories(cfg.out_dir);
    append(fs::path(cfg.out_dir) / "inference_RESULTS.md", section);
    append(fs::path(cfg.out_dir) / "inference_results.jsonl", jsonl);
    std::ofstream(fs::path(cfg.out_dir) / "inference_peer.json") << peer_result.dump(1);
    fmt::print("wrote {}/inference_RESULTS.md, inference_results.jsonl, inference_peer.json\n", cfg.out_dir);
  }
  if (!cfg.no_record && device.is_cuda()) {
    append(repo / "bench/RESULTS.md", section);
    append(repo / "bench/results.jsonl", jsonl);
    fmt::print("appended to {} and {}\n", (repo / "bench/RESULTS.md").string(), (repo / "bench/results.jsonl").string());
  }
  if (!check_ok) {
    fmt::print(stderr, "bench_inference: greedy tokens agree with transformers for only {} of the first {}\n", agree, need);
    return 3;
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_inference: {}\n", e.what());
  return 1;
}
