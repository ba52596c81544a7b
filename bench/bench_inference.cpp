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
//   (d) batch-B decode (--decode-batches, default 8,32,128): B requests of
//       --prompt-len and --new-tokens added at once, timed over the decode
//       steps after the step that prefilled all B, against the HBM roofline
//       of batch B (the weights once, B sequences' K/V at the mean context);
//   (e) prefill (--prefill-lens, default 512,2048): one prompt, one chunk,
//       max_new_tokens 1: time to first token and prefill tokens/s against
//       the FLOP floor (block matmuls, the head for one token and causal
//       attention, at --peak-tflops dense bf16; 989 = H100/H200 SXM);
//   (f) a ShareGPT-shaped mix (--mix-requests, default 1000): serve_bench.py's
//       lognormal lengths, each prompt opened by one of 4 shared 128-token
//       system prompts, all added at t = 0, run with prefix caching on and
//       off: output and total tokens/s, TTFT and TPOT mean / p50 / p99 (no peer);
//       --write-mix FILE writes these requests and exits, for serve_bench.py
//       --mix FILE to replay them over HTTP (the server's table beside these);
//   (g) CUDA: the kernels of batch-1 decode (--profile-steps under Kineto),
//       per step, against the step's wall time.
// The workloads (d)-(g) are in inference_workloads.h.
// With --cuda-graph on (the default) (a) and (c) are measured again with the
// engine's use_cuda_graph (decode steps replayed from captured graphs), and
// (d), (f), (g) use it; an engine that refuses it leaves a note in place of
// those rows and (d), (f), (g) run eagerly.
// Batch-1 decode is timed over the decode steps only (the prefill step is
// timed on its own) after a warm-up request; every engine step ends with a
// device-to-host copy of the drawn tokens, so the host clock is exact.
// Prints tables; appends to bench/RESULTS.md and bench/results.jsonl (and,
// with --out-dir, writes the same section and rows there too).
//
// Usage: bench_inference [--device cuda|cpu] [--tiny] [model shape flags]
//          [--prompt-len 128] [--new-tokens 256] [--requests 256] ...
//          [--decode-batches 8,32,128] [--prefill-lens 512,2048] [--mix-requests 1000]
//          [--profile-steps 20] [--time-limit S]
//          [--python PATH | --no-python] [--out-dir DIR] [--commit SHA] [--no-record]
// (bench_inference --help lists every flag; an empty list or 0 skips a part.)
// --device cpu --tiny is a smoke test of the whole flow; it never records.
#include "bench/bench_common.h"
#include "bench/inference_workloads.h"
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
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace models = colossus::models;
namespace inference = colossus::inference;
using nlohmann::json;
using colossus::bench::Clock;
using colossus::bench::random_tokens;
using colossus::bench::seconds_since;

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
  std::string decode_batches = "8,32,128";
  std::string prefill_lens = "512,2048";
  double peak_tflops = 989;
  int64_t mix_requests = 1000, mix_system_prompts = 4, mix_system_len = 128, mix_max_input = 1024, mix_max_output = 1024;
  int profile_steps = 20;
  std::string write_mix;  // write (f)'s requests here for serve_bench.py --mix, and exit
  double time_limit_s = 0;
  std::string command = "bench_inference";
};

// "8,32,128" -> {8, 32, 128}; "" -> {}.
std::vector<int64_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value < 1) throw std::runtime_error(fmt::format("{}: '{}' is not a positive integer", flag, item));
    out.push_back(value);
  }
  return out;
}

// A kernel's name for a Markdown cell: at most `width` characters, no '|'.
std::string kernel_cell(std::string name, size_t width = 90) {
  if (name.size() > width) name = name.substr(0, width - 3) + "...";
  std::replace(name.begin(), name.end(), '|', '/');
  return name;
}

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
  app.add_option("--decode-batches", cfg.decode_batches,
                 "batch-B decode: batch sizes, comma-separated (\"\" skips it); --prompt-len and --new-tokens each");
  app.add_option("--prefill-lens", cfg.prefill_lens, "prefill: prompt lengths, comma-separated (\"\" skips it)");
  app.add_option("--peak-tflops", cfg.peak_tflops,
                 "prefill's FLOP floor: the device's peak dense bf16 TFLOP/s (989: H100/H200 SXM)");
  app.add_option("--mix-requests", cfg.mix_requests, "ShareGPT-shaped mix: requests (0 skips it)");
  app.add_option("--mix-system-prompts", cfg.mix_system_prompts, "mix: shared system prompts");
  app.add_option("--mix-system-len", cfg.mix_system_len, "mix: tokens of each system prompt");
  app.add_option("--mix-max-input", cfg.mix_max_input, "mix: longest lognormal prompt part (after the system prompt)");
  app.add_option("--mix-max-output", cfg.mix_max_output, "mix: most new tokens of a request");
  app.add_option("--write-mix", cfg.write_mix,
                 "write (f)'s request mix to this JSON file ({\"requests\": [{\"prompt\": ids, \"max_tokens\": n}]}) "
                 "for bench/serve_bench.py --mix, so the server replays the engine's requests; then exit (no model)");
  app.add_option("--profile-steps", cfg.profile_steps, "CUDA: batch-1 decode steps under Kineto (0 skips it)");
  app.add_option("--time-limit", cfg.time_limit_s,
                 "seconds the whole bench may take (0: no limit): the peer's timeout is cut to fit");
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
    // The newer parts shrink too, unless their flags were given (e.g. "" to skip one).
    const auto unless_given = [&](const char* flag, auto& field, auto value) {
      if (app.get_option(flag)->count() == 0) field = value;
    };
    unless_given("--decode-batches", cfg.decode_batches, std::string("2,4"));
    unless_given("--prefill-lens", cfg.prefill_lens, std::string("32,64"));
    unless_given("--mix-requests", cfg.mix_requests, int64_t{12});
    unless_given("--mix-system-len", cfg.mix_system_len, int64_t{16});
    unless_given("--mix-max-input", cfg.mix_max_input, int64_t{32});
    unless_given("--mix-max-output", cfg.mix_max_output, int64_t{16});
  }
  const std::vector<int64_t> decode_batches = parse_list("--decode-batches", cfg.decode_batches);
  const std::vector<int64_t> prefill_lens = parse_list("--prefill-lens", cfg.prefill_lens);
  if (cfg.prompt_min < 1 || cfg.prompt_max < cfg.prompt_min || cfg.output_min < 1 || cfg.output_max < cfg.output_min ||
      cfg.new_tokens < 2 || cfg.prompt_len < 1 || cfg.requests < 1) {
    throw std::runtime_error("bad lengths: need 1 <= min <= max, --new-tokens >= 2, --prompt-len >= 1, --requests >= 1");
  }
  if (cfg.mix_requests < 0 || cfg.mix_system_prompts < 1 || cfg.mix_system_len < 0 || cfg.mix_max_input < 4 ||
      cfg.mix_max_output < 4 || cfg.profile_steps < 0 || !(cfg.peak_tflops > 0)) {
    throw std::runtime_error("bad mix / profile flags: need --mix-requests >= 0, --mix-system-prompts >= 1, "
                             "--mix-system-len >= 0, --mix-max-input and --mix-max-output >= 4 (the mix's shortest), "
                             "--profile-steps >= 0, --peak-tflops > 0");
  }
  const colossus::bench::MixShape mix_shape{.requests = cfg.mix_requests, .system_prompts = cfg.mix_system_prompts,
                                            .system_len = cfg.mix_system_len, .min_input = 4,
                                            .max_input = cfg.mix_max_input, .min_output = 4,
                                            .max_output = cfg.mix_max_output, .seed = cfg.seed + 3};
  if (!cfg.write_mix.empty()) {
    if (cfg.mix_requests < 1) throw std::runtime_error("--write-mix needs --mix-requests >= 1");
    json requests = json::array();
    int64_t prompt_tokens = 0, output_tokens = 0;
    for (const auto& r : colossus::bench::sharegpt_mix(mix_shape, cfg.vocab)) {
      requests.push_back({{"prompt", r.prompt}, {"max_tokens", r.new_tokens}});
      prompt_tokens += static_cast<int64_t>(r.prompt.size());
      output_tokens += r.new_tokens;
    }
    std::ofstream out(cfg.write_mix);
    out << json{{"source", cfg.command}, {"vocab", cfg.vocab}, {"requests", requests}}.dump() << "\n";
    if (!out) throw std::runtime_error(fmt::format("--write-mix {}: cannot write the file", cfg.write_mix));
    fmt::print("wrote {} requests ({} prompt + {} output tokens, vocab {}) to {}\n", requests.size(), prompt_tokens,
               output_tokens, cfg.vocab, cfg.write_mix);
    return 0;
  }
  const c10::Device device = cfg.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (device.is_cuda() && !at::hasCUDA()) throw std::runtime_error("no CUDA device (use --device cpu --tiny)");
  const auto t_start = Clock::now();

  // The model, and its HF directory for the peer.
  models::LlamaConfig mc;
  mc.vocab_size = cfg.vocab, mc.hidden_size = cfg.hidden, mc.intermediate_size = cfg.intermediate;
  mc.num_hidden_layers = cfg.layers, mc.num_attention_heads = cfg.heads, mc.num_key_value_heads = cfg.kv_heads;
  const int64_t mix_context = cfg.mix_system_len + cfg.mix_max_input + cfg.mix_max_output;
  const int64_t longest_prefill = prefill_lens.empty() ? 0 : *std::max_element(prefill_lens.begin(), prefill_lens.end()) + 1;
  mc.max_position_embeddings = std::max({int64_t{2048}, cfg.prompt_len + cfg.new_tokens, cfg.prompt_max + cfg.output_max,
                                         longest_prefill, cfg.mix_requests > 0 ? mix_context : 0});
  mc.rms_norm_eps = 1e-5, mc.rope_theta = 10000.0;
  auto model = models::create_model(mc, {.seed = cfg.seed, .dtype = at::kBFloat16, .device = device});
  double param_bytes = 0, embed_bytes = 0;
  for (const auto& p : model->parameters()) param_bytes += static_cast<double>(p.nbytes());
  embed_bytes = static_cast<double>(model->embedding().weight.nbytes());
  const double params = param_bytes / 2;
  double head_params = 0;  // an untied head's (V, C); the FLOP floor counts it for one token
  if (const auto* head = model->lm_head()) {
    for (const auto& p : head->parameters()) head_params += static_cast<double>(p.numel());
  }
  const double block_params = params - embed_bytes / 2 - head_params;
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

  // (d) Batch-B decode, with CUDA graphs when the batch-1 run could use them.
  const colossus::bench::EngineBase base{.block_size = cfg.block_size, .cuda_graph = try_graphs && ours_graph.has_value()};
  std::vector<colossus::bench::BatchDecode> batch_decodes;
  for (const int64_t b : decode_batches) {
    try {
      batch_decodes.push_back(colossus::bench::run_batch_decode(model, base, b, cfg.prompt_len, cfg.new_tokens, cfg.vocab,
                                                                cfg.seed + 10 + static_cast<uint64_t>(b)));
    } catch (const std::exception& e) {
      if (!base.cuda_graph) throw;
      graph_notes.push_back(fmt::format("batch-{} decode with CUDA graphs failed: {}", b, e.what()));
      fmt::print("{}\n", graph_notes.back());
      continue;
    }
    const auto& r = batch_decodes.back();
    fmt::print("colossus batch-{} decode{}: prefill {:.1f} ms ({} step{}), decode {:.0f} tokens/s ({:.2f} ms/step, {} of "
               "{} steps from graphs)\n",
               b, base.cuda_graph ? ", CUDA graphs" : "", r.prefill_ms, r.prefill_steps, r.prefill_steps == 1 ? "" : "s",
               r.tokens_per_s, 1e3 * r.decode_s / static_cast<double>(cfg.new_tokens - 1), r.graph_steps,
               cfg.new_tokens - 1);
    std::fflush(stdout);
  }

  // (e) Prefill of one prompt against the FLOP floor.
  std::vector<colossus::bench::Prefill> prefills;
  const auto floor_seconds = [&](int64_t tokens) {
    return colossus::bench::prefill_flops(block_params, head_params, cfg.layers, cfg.hidden, tokens) / (cfg.peak_tflops * 1e12);
  };
  for (const int64_t t : prefill_lens) {
    prefills.push_back(colossus::bench::run_prefill(model, base, t, cfg.vocab, cfg.seed + 20 + static_cast<uint64_t>(t),
                                                    /*runs=*/3, /*profile=*/device.is_cuda() && cfg.profile_steps > 0));
    const auto& r = prefills.back();
    fmt::print("colossus prefill, {} tokens: time to first token {:.2f} ms = {:.0f} tokens/s (FLOP floor {:.2f} ms at {} "
               "TFLOP/s: {:.2f} of it)\n",
               t, r.ttft_ms, r.tokens_per_s, floor_seconds(t) * 1e3, cfg.peak_tflops, floor_seconds(t) * 1e3 / r.ttft_ms);
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
  // (f) The ShareGPT-shaped mix, prefix caching on and off.
  struct MixRun {
    bool prefix_caching = false;
    colossus::bench::MixResult result;
  };
  std::vector<MixRun> mixes;
  if (cfg.mix_requests > 0) {
    const std::vector<colossus::bench::MixRequest> mix = colossus::bench::sharegpt_mix(mix_shape, cfg.vocab);
    for (const bool caching : {true, false}) {
      inference::InferenceConfig ic{.max_batch_size = cfg.max_batch_size,
                                    .max_input_len = cfg.mix_system_len + cfg.mix_max_input,
                                    .max_output_len = cfg.mix_max_output,
                                    .max_num_batched_tokens = cfg.max_num_batched_tokens, .dtype = "bf16",
                                    .block_size = cfg.block_size,
                                    .num_blocks = cfg.max_batch_size * blocks_for(mix_context) + 64,
                                    .enable_prefix_caching = caching};
      ic.use_cuda_graph = base.cuda_graph;
      ic.max_context_len_to_capture = mix_context;
      try {
        mixes.push_back({caching, colossus::bench::run_mix(model, ic, mix, cfg.vocab, cfg.seed + 4)});
      } catch (const std::exception& e) {
        if (!base.cuda_graph) throw;
        graph_notes.push_back(fmt::format("the mix with CUDA graphs (prefix caching {}) failed: {}", caching ? "on" : "off",
                                          e.what()));
        fmt::print("{}\n", graph_notes.back());
        continue;
      }
      const auto& m = mixes.back().result;
      fmt::print("colossus mix, {} requests, prefix caching {}: {:.2f} s, {:.0f} output tokens/s, {:.0f} total tokens/s, "
                 "TTFT p50 {:.1f} ms, TPOT p50 {:.2f} ms ({} steps, {} prompt tokens computed, {} reused, {} "
                 "preemptions)\n",
                 cfg.mix_requests, caching ? "on" : "off", m.seconds, m.output_tokens_per_s, m.total_tokens_per_s,
                 m.ttft_ms.p50, m.tpot_ms.p50, m.stats.steps, m.stats.prompt_tokens, m.cached_prompt_tokens,
                 m.stats.preemptions);
      std::fflush(stdout);
    }
  }

  // (g) The kernels of batch-1 decode (CUDA).
  std::optional<colossus::bench::DecodeProfile> profile;
  if (device.is_cuda() && cfg.profile_steps > 0) {
    try {
      profile = colossus::bench::profile_decode(model, base, prompt, cfg.profile_steps);
      fmt::print("colossus batch-1 decode{}, {} steps under Kineto: {:.1f} us of kernels a step, {:.1f} us wall\n",
                 base.cuda_graph ? ", CUDA graphs" : "", cfg.profile_steps, profile->kernel_ms_per_step * 1e3,
                 profile->wall_ms_per_step * 1e3);
    } catch (const std::exception& e) {
      graph_notes.push_back(fmt::format("the kernel profile failed: {}", e.what()));
      fmt::print("{}\n", graph_notes.back());
    }
    std::fflush(stdout);
  }

  model.reset();
  if (device.is_cuda()) at::accelerator::emptyCache();  // the peer's process gets the card

  // (b) The transformers peer.
  json peer_result;
  const fs::path repo = colossus::bench::repo_root();
  // Under --time-limit the peer gets what is left, less 15 s for the tables.
  int peer_timeout_s = cfg.peer_timeout_s;
  if (cfg.time_limit_s > 0) {
    peer_timeout_s = std::min(peer_timeout_s, static_cast<int>(cfg.time_limit_s - seconds_since(t_start) - 15));
  }
  if (peer && peer_timeout_s < 30) {
    graph_notes.push_back(fmt::format("the transformers peer was not run: {} s were left of --time-limit {}",
                                      peer_timeout_s + 15, cfg.time_limit_s));
    fmt::print("{}\n", graph_notes.back());
  } else if (peer) {
    json spec{{"decode", {{"prompt", prompt}, {"warmup_prompt", warmup_prompt}, {"new_tokens", cfg.new_tokens}}},
              {"throughput", json::array()}};
    for (const Request& r : requests) spec["throughput"].push_back({{"prompt", r.prompt}, {"new_tokens", r.new_tokens}});
    const fs::path spec_path = workdir / "requests.json";
    std::ofstream(spec_path) << spec.dump();
    std::string python = cfg.python;
    if (python.empty()) python = fs::exists(repo / ".venv/bin/python") ? (repo / ".venv/bin/python").string() : "python3";
    const std::string out = colossus::bench::run_command(fmt::format(
        "timeout {} '{}' '{}' --model '{}' --requests '{}' --device {} --variants {} --batch {} --max-seconds {}",
        peer_timeout_s, python, (repo / "bench/bench_inference.py").string(), model_dir.string(), spec_path.string(),
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
  // Above 1 is faster than the peer either way: ours over the peer's for a
  // rate, the peer's over ours for a time (e.g. the FLOP floor's ms over ours).
  const auto ratio_of = [](const Row& r) {
    if (r.peer_value <= 0 || r.value <= 0) return 0.0;
    return r.metric.ends_with("_ms") ? r.peer_value / r.value : r.value / r.peer_value;
  };
  const std::string eager = "colossus InferenceEngine, eager";
  const std::string graphed = "colossus InferenceEngine, CUDA graphs (use_cuda_graph)";
  const std::string base_impl = base.cuda_graph ? graphed : eager;
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
  for (const auto& b : batch_decodes) {
    // The roofline of batch B: the weights once, B sequences' K/V at the mean context.
    const double bytes = weight_bytes + static_cast<double>(b.batch) * kv_bytes_per_token * avg_context;
    rows.push_back({fmt::format("batch-{} decode, prompt {}, {} new tokens (greedy)", b.batch, cfg.prompt_len, cfg.new_tokens),
                    base_impl, "decode_tokens_per_s", b.tokens_per_s,
                    fmt::format("HBM roofline, batch {}: {:.3f} GB/step (weights {:.3f} + {} x KV {:.1f} MB at mean context "
                                "{:.0f}) at copy bandwidth {:.0f} GB/s",
                                b.batch, bytes / 1e9, weight_bytes / 1e9, b.batch, kv_bytes_per_token * avg_context / 1e6,
                                avg_context, bandwidth / 1e9),
                    static_cast<double>(b.batch) * bandwidth / bytes});
  }
  rows.push_back({through_workload, eager, "throughput_tokens_per_s", through_tps, hf_through, peer_tps});
  if (through_graph) {
    rows.push_back({through_workload, graphed, "throughput_tokens_per_s", through_graph->tokens_per_s, hf_through, peer_tps});
  }
  std::vector<std::string> lines = {"| workload | colossus | tok/s | peer | peer tok/s | colossus / peer |",
                                    "|---|---|---|---|---|---|"};
  for (const Row& r : rows) {
    lines.push_back(fmt::format("| {} | {} | {:.1f} | {} | {:.1f} | {} |", r.workload, r.impl, r.value, r.peer, r.peer_value,
                                r.peer_value > 0 ? fmt::format("{:.2f}", ratio_of(r)) : "-"));
  }

  // Prefill: its own table (a time and a rate against the FLOP floor).
  if (!prefills.empty()) {
    lines.insert(lines.end(), {"", "| prompt tokens | time to first token (ms) | prefill tok/s | FLOP floor (ms) | floor / ours |",
                               "|---|---|---|---|---|"});
  }
  for (const auto& p : prefills) {
    const double floor_s = floor_seconds(p.tokens);
    const std::string workload = fmt::format("prefill, {}-token prompt (one chunk, max_new_tokens 1, median of {} after a "
                                             "warm-up)",
                                             p.tokens, p.runs);
    const std::string floor_peer = fmt::format(
        "FLOP floor: {:.3f} TFLOP (2 x {:.3f}B block params x {} tokens + the head for one token + causal attention "
        "2 x 2 x {} layers x T^2/2 x {}) at {} TFLOP/s dense bf16 (--peak-tflops)",
        colossus::bench::prefill_flops(block_params, head_params, cfg.layers, cfg.hidden, p.tokens) / 1e12, block_params / 1e9,
        p.tokens, cfg.layers, cfg.hidden, cfg.peak_tflops);
    rows.push_back({workload, eager, "ttft_ms", p.ttft_ms, floor_peer, floor_s * 1e3});
    rows.push_back({workload, eager, "prefill_tokens_per_s", p.tokens_per_s, floor_peer, static_cast<double>(p.tokens) / floor_s});
    lines.push_back(fmt::format("| {} | {:.2f} | {:.0f} | {:.2f} | {:.2f} |", p.tokens, p.ttft_ms, p.tokens_per_s,
                                floor_s * 1e3, floor_s * 1e3 / p.ttft_ms));
  }

  // Where a prefill's device time goes: by kernel category, the matmuls'
  // rate against the peak, then the largest prompt's top kernels.
  if (!prefills.empty() && !prefills.back().kernels.empty()) {
    lines.insert(lines.end(), {"", "Kernels of one prefill (Kineto; categories from kernel names):", "",
                               "| prompt tokens | kernels ms | matmul ms (TFLOP/s) | attention ms | other ms | wall ms |",
                               "|---|---|---|---|---|---|"});
    for (const auto& p : prefills) {
      const auto cat = ::bench::by_category(p.kernels);
      const auto get = [&](const char* c) { return cat.count(c) ? cat.at(c) : 0.0; };
      const double matmul = get("matmul"), attention = get("attention");
      const double matmul_tflops = matmul > 0 ? 2.0 * block_params * static_cast<double>(p.tokens) / (matmul * 1e-3) / 1e12 : 0;
      lines.push_back(fmt::format("| {} | {:.2f} | {:.2f} ({:.0f}) | {:.2f} | {:.2f} | {:.2f} |", p.tokens, p.kernel_ms, matmul,
                                  matmul_tflops, attention, p.kernel_ms - matmul - attention, p.ttft_ms));
    }
    const auto& big = prefills.back();
    lines.insert(lines.end(), {"", fmt::format("The {}-token prefill's largest kernels:", big.tokens), "",
                               "| kernel | calls | device ms | share |", "|---|---|---|---|"});
    for (size_t i = 0; i < std::min<size_t>(12, big.kernels.size()); ++i) {
      const auto& k = big.kernels[i];
      lines.push_back(fmt::format("| {} | {:.0f} | {:.3f} | {:.1f}% |", kernel_cell(k.name), k.calls, k.device_ms,
                                  100.0 * k.device_ms / big.kernel_ms));
    }
  }

  // The mix: vLLM benchmark's figures, no peer.
  const std::string mix_workload = fmt::format(
      "ShareGPT-shaped mix: {} requests added at t=0; prompt = one of {} shared {}-token system prompts (seeded) + "
      "lognormal(median 160, sigma 0.8) tokens clipped to [4, {}]; output lognormal(median 190, sigma 0.7) clipped to "
      "[4, {}] (seed {})",
      cfg.mix_requests, cfg.mix_system_prompts, cfg.mix_system_len, cfg.mix_max_input, cfg.mix_max_output, mix_shape.seed);
  if (!mixes.empty()) {
    lines.insert(lines.end(), {"", "| prefix caching | output tok/s | total tok/s | TTFT mean / p50 / p99 (ms) | "
                                   "TPOT mean / p50 / p99 (ms) | prompt tokens computed / reused | steps | preemptions |",
                               "|---|---|---|---|---|---|---|---|"});
  }
  for (const auto& [caching, m] : mixes) {
    const std::string impl = fmt::format("{}, prefix caching {}", base_impl, caching ? "on" : "off");
    for (const auto& [metric, value] : std::vector<std::pair<std::string, double>>{
             {"mix_output_tokens_per_s", m.output_tokens_per_s}, {"mix_total_tokens_per_s", m.total_tokens_per_s},
             {"mix_ttft_ms_mean", m.ttft_ms.mean}, {"mix_ttft_ms_p50", m.ttft_ms.p50}, {"mix_ttft_ms_p99", m.ttft_ms.p99},
             {"mix_tpot_ms_mean", m.tpot_ms.mean}, {"mix_tpot_ms_p50", m.tpot_ms.p50}, {"mix_tpot_ms_p99", m.tpot_ms.p99}}) {
      rows.push_back({mix_workload, impl, metric, value, "none", 0.0});
    }
    lines.push_back(fmt::format("| {} | {:.0f} | {:.0f} | {:.1f} / {:.1f} / {:.1f} | {:.2f} / {:.2f} / {:.2f} | {} / {} | {} | {} |",
                                caching ? "on" : "off", m.output_tokens_per_s, m.total_tokens_per_s, m.ttft_ms.mean,
                                m.ttft_ms.p50, m.ttft_ms.p99, m.tpot_ms.mean, m.tpot_ms.p50, m.tpot_ms.p99,
                                m.stats.prompt_tokens, m.cached_prompt_tokens, m.stats.steps, m.stats.preemptions));
  }

  // The kernels of a batch-1 decode step.
  if (profile) {
    lines.insert(lines.end(), {"", fmt::format("Kernels of one batch-1 decode step ({}, prompt {}; {} steps under Kineto):",
                                               base_impl, cfg.prompt_len, profile->steps),
                               "", "| kernel | calls / step | device us / step | share |", "|---|---|---|---|"});
    const size_t top = std::min<size_t>(25, profile->kernels.size());
    double shown_ms = 0, calls = 0;
    for (const auto& k : profile->kernels) calls += k.calls;
    for (size_t i = 0; i < top; ++i) {
      const auto& k = profile->kernels[i];
      shown_ms += k.device_ms;
      lines.push_back(fmt::format("| {} | {:.1f} | {:.1f} | {:.1f}% |", kernel_cell(k.name), k.calls, k.device_ms * 1e3,
                                  100.0 * k.device_ms / profile->kernel_ms_per_step));
    }
    if (top < profile->kernels.size()) {
      lines.push_back(fmt::format("| ({} other kernels) | | {:.1f} | {:.1f}% |", profile->kernels.size() - top,
                                  (profile->kernel_ms_per_step - shown_ms) * 1e3,
                                  100.0 * (profile->kernel_ms_per_step - shown_ms) / profile->kernel_ms_per_step));
    }
    const double gap_ms = profile->wall_ms_per_step - profile->kernel_ms_per_step;
    lines.push_back(fmt::format(
        "| **all kernels, summed** | {:.1f} | {:.1f} | wall {:.1f} us / step: {:.1f} us ({:.0f}%) launch gaps and host "
        "time |",
        calls, profile->kernel_ms_per_step * 1e3, profile->wall_ms_per_step * 1e3, gap_ms * 1e3,
        100.0 * gap_ms / profile->wall_ms_per_step));
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
  for (const auto& b : batch_decodes) {
    notes += fmt::format(" batch-{}: prefill of all {} in {:.1f} ms ({} step{}), {} tokens decoded in {:.3f} s, {} steps "
                         "from CUDA graphs.",
                         b.batch, b.batch, b.prefill_ms, b.prefill_steps, b.prefill_steps == 1 ? "" : "s", b.decode_tokens,
                         b.decode_s, b.graph_steps);
  }
  for (const auto& [caching, m] : mixes) {
    notes += fmt::format(" mix, prefix caching {}: {} prompt + {} output tokens in {:.2f} s, {} steps ({} from CUDA "
                         "graphs), prefix cache {} hits of {} queries.",
                         caching ? "on" : "off", m.prompt_tokens, m.output_tokens, m.seconds, m.stats.steps,
                         m.stats.graph_steps, m.stats.prefix_cache_hits, m.stats.prefix_cache_queries);
  }
  for (const auto& n : graph_notes) notes += " " + n + ".";
  if (through_graph) {
    notes += fmt::format(" CUDA graphs, throughput: {} steps in {:.2f} s; each batch-size bucket's graph is captured on "
                         "first use, inside the timed run.",
                         through_graph->stats.steps, through_graph->seconds);
  }

  // Machine, date, commit.
  std::string machine = colossus::bench::machine_name(false);
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
  const std::string commit = colossus::bench::commit_or(cfg.commit, repo, "unknown (pass --commit)");
  const std::string date = colossus::bench::today(colossus::bench::kDateTimeUtc);
  const std::string config = fmt::format(
      "llama-1b-like: hidden {}, {} layers, {} query / {} KV heads of {}, SwiGLU {}, vocab {}, untied head ({:.3f}B params), "
      "seeded random weights (seed {}), bf16; engine: paged KV cache (block {}), {}, greedy, "
      "ignore_eos; throughput and mix engines max_batch_size {}, max_num_batched_tokens {}; batch-B decode engine "
      "max_batch_size B, max_num_batched_tokens B x prompt (one prefill step), a warm-up batch first; prefill: one chunk, "
      "prefix caching off, FLOP floor at {} TFLOP/s dense bf16 (--peak-tflops; 989 = H100/H200 SXM); mix: a warm-up "
      "through every CUDA-graph batch bucket first, TTFT to the step returning the first token, TPOT = (e2e - TTFT) / "
      "(output - 1); peer: transformers {} (torch {}) on the same weights (save_pretrained -> from_pretrained), not run "
      "for batch-B decode, prefill or the mix",
      cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, head_dim, cfg.intermediate, cfg.vocab, params / 1e9, cfg.seed,
      cfg.block_size, device.is_cuda() ? "CUDA paged-attention kernels" : "reference attention (CPU)", cfg.max_batch_size,
      cfg.max_num_batched_tokens, cfg.peak_tflops,
      peer_result.is_object() ? peer_result.value("transformers", std::string("-")) : "-",
      peer_result.is_object() ? peer_result.value("torch", std::string("-")) : "-");

  // Every row beside its latest earlier value in bench/results.jsonl (same
  // workload, implementation and metric), on this GPU model when one exists.
  {
    const std::string gpu = machine.substr(0, machine.find(" ("));
    // The tables above name each workload in full; here the head of it.
    const auto short_workload = [](const std::string& w) { return w.substr(0, std::min(w.find(" ("), w.find(": "))); };
    const auto short_impl = [](const std::string& impl) {
      const std::string prefix = "colossus InferenceEngine, ";
      return impl.rfind(prefix, 0) == 0 ? impl.substr(prefix.size()) : impl;
    };
    std::map<std::string, json> same_gpu, any_gpu;
    std::ifstream history(repo / "bench/results.jsonl");
    for (std::string line; std::getline(history, line);) {
      const json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!r.is_object() || r.value("bench", "") != "inference" || !r.contains("workload")) continue;
      const std::string key = r.value("workload", "") + "|" + r.value("impl", "") + "|" + r.value("metric", "");
      any_gpu[key] = r;
      if (r.value("machine", "").rfind(gpu, 0) == 0) same_gpu[key] = r;
    }
    lines.insert(lines.end(), {"", "Against the latest earlier run (bench/results.jsonl; the same GPU model where there is one):",
                               "", "| workload | colossus | metric | now | previous | ratio | previous run |", "|---|---|---|---|---|---|---|"});
    for (const Row& r : rows) {
      const std::string key = r.workload + "|" + r.impl + "|" + r.metric;
      const json* prev = same_gpu.count(key) ? &same_gpu.at(key) : any_gpu.count(key) ? &any_gpu.at(key) : nullptr;
      if (prev == nullptr) {
        lines.push_back(fmt::format("| {} | {} | {} | {:.2f} | - | - | none |", short_workload(r.workload),
                                    short_impl(r.impl), r.metric, r.value));
        continue;
      }
      const double before = prev->value("value", 0.0);
      lines.push_back(fmt::format("| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {}, {}, {} |", short_workload(r.workload),
                                  short_impl(r.impl), r.metric,
                                  r.value, before, before != 0 ? r.value / before : 0.0, prev->value("date", ""),
                                  prev->value("machine", "").substr(0, prev->value("machine", "").find(" (")),
                                  prev->value("commit", "")));
    }
  }

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
                  {"peer_value", r.peer_value}, {"ratio", ratio_of(r)},
                  {"greedy_agreement", agree}}
                 .dump() +
             "\n";
  }
  const auto append = colossus::bench::append_file;
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
