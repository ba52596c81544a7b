// GPU training throughput of GPT-2 (issue 3's acceptance benchmark): Colossus
// trains gpt2-124m in bf16 with fp32 master weights (bf16 model parameters,
// amp::MixedPrecisionOptimizer around HybridAdam's fused multi-tensor CUDA
// AdamW), then runs the PyTorch peers in the same run (bench/bench_train_gpt2.py:
// Hugging Face GPT2LMHeadModel in eager mode, fp32 params + autocast(bf16) +
// fused AdamW, and variants) on the same initial weights and the same batches.
// Prints tokens/s, ms/step, MFU and peak memory side by side, the first
// losses of both (a correctness check: same init, same data, so they must
// agree to bf16 rounding), and where our step's time goes (forward, backward,
// optimizer, by CUDA events).
//
// Random token batches (fixed seed) are made once and kept on the device, so
// no data loading is timed. The clock runs from a device synchronisation after
// the warm-up steps to one after the last timed step; nothing in between
// synchronises except what the training step itself does.
//
// MFU = (6 N + 6 L d T) * tokens/s / 989e12, N the parameters without the
// position embedding (the tied wte counts once, as the head's matmul), L
// layers, d width, T sequence length; 989 TFLOP/s is the H100/H200 dense bf16
// datasheet rate.
//
// Builds in every tree (it uses torch's device-generic accelerator API, no
// CUDA headers); without a CUDA device it says so and exits 2, unless run with
// --device cpu, a small-model smoke test of the whole flow (CPU bf16 autocast
// on the peer side).
//
// Usage: bench_train_gpt2 [--model gpt2-124m] [--batch 16] [--seq 1024]
//          [--steps 50] [--warmup 10] [--check-steps 10] [--phase-steps 5]
//          [--batches 8] [--seed 0] [--device cuda|cpu]
//          [--peers eager-amp,eager-bf16,compile-amp | --no-python]
//          [--python PATH] [--peer-timeout 300] [--workdir DIR] [--json PATH]
//          [--profile-steps 3] [--cuda-graph both|on|off] [--fp8 tensorwise|rowwise]
//          [--checkpoint none|full|mlp]
// --fp8 (issue 28): one more Colossus run with FP8 linear layers in the middle
// blocks (models::enable_fp8, e5m2 gradients; first/last block in bf16), the
// same init and batches: its tok/s beside our bf16 step and its first losses
// against bf16's; on CUDA the ATen-quantise run (Fp8Recipe::fused_quantize
// false, the reference) and the fused quantise kernel's (the default), with
// the distance between their losses.
// --checkpoint full|mlp: every block of ours checkpointed at that granularity
// (models::enable_activation_checkpointing); the peers use transformers'
// gradient checkpointing, which has only whole layers (full), so an mlp row of
// ours stands beside the peers' full rows. For the 8B shape on one GPU:
// --model llama3-8b-like --seq 4096 --batch 1 --checkpoint full
// --peers compile-bf16 --cuda-graph off (the peer in bf16 params and AdamW
// states, 8 bytes a parameter, since 16 do not fit beside activations).
// --profile-steps N (CUDA): N more steps under the Kineto profiler, ours and
// each peer's; prints device time per kernel category and the top kernels.
// --cuda-graph (CUDA; default both): our step captured in a CUDA graph after 3
// eager steps (amp::GraphedTrainStep) and replayed; `both` also times the
// eager step first and prints it as a row of its own.
#include "bench/bench_common.h"
#include "colossus/amp/graphed_train_step.h"
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/core/accelerator.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/fp8_linear.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/hybrid_adam.h"
#include "kernel_profile.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace models = colossus::models;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string model = "gpt2-124m";
  int64_t batch = 16;
  int64_t seq = 1024;
  int steps = 50;
  int warmup = 10;
  int check_steps = 10;
  int phase_steps = 5;
  int profile_steps = 3;
  int64_t batches = 8;  // distinct random batches, cycled
  uint64_t seed = 0;
  std::string device = "cuda";
  std::vector<std::string> peers = {"eager-amp", "eager-bf16"};
  std::string python;
  int peer_timeout_s = 300;  // a peer that hangs (a stuck compile) loses its row, not the run
  std::string workdir = "/tmp/bench_train_gpt2";
  std::string json_path;
  std::string command = "bench_train_gpt2";
  std::string cuda_graph = "both";
  std::string fp8;  // "", "tensorwise" or "rowwise"
  std::string checkpoint = "none";  // activation checkpointing of every block: none, full or mlp
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    c.command += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      c.command += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--model") c.model = next();
    else if (a == "--batch") c.batch = std::stoll(next());
    else if (a == "--seq") c.seq = std::stoll(next());
    else if (a == "--steps") c.steps = std::stoi(next());
    else if (a == "--warmup") c.warmup = std::stoi(next());
    else if (a == "--check-steps") c.check_steps = std::stoi(next());
    else if (a == "--phase-steps") c.phase_steps = std::stoi(next());
    else if (a == "--profile-steps") c.profile_steps = std::stoi(next());
    else if (a == "--batches") c.batches = std::stoll(next());
    else if (a == "--seed") c.seed = std::stoull(next());
    else if (a == "--device") c.device = next();
    else if (a == "--peers") c.peers = split_list(next());
    else if (a == "--no-python") c.peers.clear();
    else if (a == "--python") c.python = next();
    else if (a == "--peer-timeout") c.peer_timeout_s = std::stoi(next());
    else if (a == "--workdir") c.workdir = next();
    else if (a == "--json") c.json_path = next();
    else if (a == "--cuda-graph") c.cuda_graph = next();
    else if (a == "--fp8") c.fp8 = next();
    else if (a == "--checkpoint") c.checkpoint = next();
    else throw std::runtime_error("unknown flag " + a + " (see the usage at the top of bench_train_gpt2.cpp)");
  }
  if (c.steps < 1 || c.warmup < 1 || c.batch < 1 || c.seq < 2 || c.batches < 1 || c.phase_steps < 0) {
    throw std::runtime_error("--steps, --warmup, --batch, --batches must be >= 1, --seq >= 2, --phase-steps >= 0");
  }
  if (c.cuda_graph != "both" && c.cuda_graph != "on" && c.cuda_graph != "off") {
    throw std::runtime_error("--cuda-graph is '" + c.cuda_graph + "'; use both, on or off");
  }
  if (!c.fp8.empty() && c.fp8 != "tensorwise" && c.fp8 != "rowwise") {
    throw std::runtime_error("--fp8 is '" + c.fp8 + "'; use tensorwise or rowwise");
  }
  if (c.checkpoint != "none" && c.checkpoint != "full" && c.checkpoint != "mlp") {
    throw std::runtime_error("--checkpoint is '" + c.checkpoint + "'; use none, full or mlp");
  }
  if (c.device != "cuda") {
    c.profile_steps = 0;
    c.cuda_graph = "off";
  }
  if (c.device != "cuda" && c.device != "cpu") throw std::runtime_error("--device is '" + c.device + "'; use cuda or cpu");
  c.check_steps = std::min(c.check_steps, c.warmup + c.steps);
  return c;
}

// Waits for all queued work on the device (a no-op on CPU).
void sync(const c10::Device& device) {
  if (device.is_cuda()) at::accelerator::synchronizeDevice(device.index());
}

// Marks a point in the device's stream for timing: a CUDA event with timing
// on, plus the host clock (which shows whether the host or the GPU is behind).
struct Mark {
  std::optional<c10::Event> event;
  Clock::time_point host;
};

Mark mark(const c10::Device& device) {
  Mark m{std::nullopt, Clock::now()};
  if (device.is_cuda()) {
    m.event.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    m.event->record(at::accelerator::getCurrentStream(device.index()));
  }
  return m;
}

// Device milliseconds between two marks (host milliseconds on CPU).
double device_ms(const Mark& a, const Mark& b) {
  if (a.event) return a.event->elapsedTime(*b.event);
  return std::chrono::duration<double, std::milli>(b.host - a.host).count();
}

double host_ms(const Mark& a, const Mark& b) { return std::chrono::duration<double, std::milli>(b.host - a.host).count(); }

struct Phases {
  std::map<std::string, double> device_ms;  // mean per step
  std::map<std::string, double> host_ms;
};

struct Result {
  double ms_per_step = 0;
  double tokens_per_s = 0;
  double peak_allocated_gib = 0;
  double peak_reserved_gib = 0;
  std::vector<double> losses;  // every step, warm-up included
  Phases phases;
  std::vector<bench::KernelStat> kernels;  // per step, with --profile-steps
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Trains `cfg.warmup + cfg.steps` timed-at-the-ends steps, then (eager step
// only) `phase_steps` steps with a mark between forward, backward and optimizer.
Result train_colossus(const Config& cfg, const models::ModelConfig& model_config, const c10::Device& device,
                      const at::Tensor& data, const fs::path& init_dir, bool graphed,
                      const std::optional<models::Fp8Recipe>& fp8 = std::nullopt) {
  auto model = models::create_model(model_config, {.seed = cfg.seed, .dtype = at::kBFloat16, .device = device});
  model->train();
  // The peers start from exactly these (bf16-valued) weights.
  if (!init_dir.empty()) models::save_pretrained(*model, init_dir.string());
  if (cfg.checkpoint != "none") {
    const int64_t wrapped =
        models::enable_activation_checkpointing(*model, 1.0, models::parse_checkpoint_granularity(cfg.checkpoint));
    fmt::print("activation checkpointing: {} blocks, granularity {}\n", wrapped, cfg.checkpoint);
  }
  if (fp8) {
    const int64_t swapped = models::enable_fp8(*model, *fp8);
    fmt::print("fp8: {} linear layers in FP8 ({})\n", swapped, fp8->rowwise ? "rowwise" : "tensorwise");
  }
  namespace optim = colossus::optim;
  auto inner = std::make_unique<optim::HybridAdam>(
      model->parameters(), optim::HybridAdamOptions{.lr = 6e-4, .betas = {0.9, 0.95}, .eps = 1e-8,
                                                    .weight_decay = 0.1, .adamw_mode = true});
  colossus::amp::MixedPrecisionOptimizer opt(std::move(inner), {.precision = "bf16"});

  std::vector<at::Tensor> losses;  // read after the clock stops: .item() would synchronise
  const int64_t num_batches = data.size(0);
  auto forward = [&](int64_t step) {
    const at::Tensor ids = data[step % num_batches];  // (B, T) int64, labels are the inputs (shifted inside)
    // The head fused with the cross-entropy (models/linear_cross_entropy.h).
    return model->forward_loss(ids, ids);
  };
  auto update = [&] {
    opt.step();
    opt.zero_grad(/*set_to_none=*/true);
  };
  std::optional<colossus::amp::GraphedTrainStep> graph;
  if (graphed) {
    graph.emplace([&](const at::Tensor& ids) { return model->forward_loss(ids, ids); }, opt,
                  colossus::amp::GraphedTrainStepOptions{.eager_steps = 3});
  }
  auto train_step = [&](int64_t step) {
    if (graph) return graph->step(data[step % num_batches]);
    at::Tensor loss = forward(step);
    loss.backward();
    update();
    return loss.detach();
  };
  int64_t step = 0;
  Clock::time_point start;
  for (int i = 0; i < cfg.warmup + cfg.steps; ++i, ++step) {
    if (i == cfg.warmup) {
      sync(device);
      // Peak memory of the timed steps; everything resident (weights, masters,
      // Adam state) still counts, as with the peers' reset at the same point.
      if (device.is_cuda()) at::accelerator::resetPeakStats(device.index());
      start = Clock::now();
    }
    losses.push_back(train_step(step));
  }
  sync(device);
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();

  Result r;
  r.ms_per_step = total_ms / cfg.steps;
  r.tokens_per_s = static_cast<double>(cfg.batch * cfg.seq) * 1e3 / r.ms_per_step;
  for (const auto& l : losses) r.losses.push_back(l.item<double>());

  // Phase breakdown: separate steps, so the marks cannot disturb the figure above.
  for (int i = 0; i < (graph ? 0 : cfg.phase_steps); ++i, ++step) {
    const Mark m0 = mark(device);
    at::Tensor loss = forward(step);
    const Mark m1 = mark(device);
    loss.backward();
    const Mark m2 = mark(device);
    update();
    const Mark m3 = mark(device);
    sync(device);
    const std::pair<const char*, std::pair<const Mark*, const Mark*>> spans[] = {
        {"forward+loss", {&m0, &m1}}, {"backward", {&m1, &m2}}, {"optimizer", {&m2, &m3}}, {"step", {&m0, &m3}}};
    for (const auto& [name, span] : spans) {
      r.phases.device_ms[name] += device_ms(*span.first, *span.second) / cfg.phase_steps;
      r.phases.host_ms[name] += host_ms(*span.first, *span.second) / cfg.phase_steps;
    }
  }
  if (cfg.profile_steps > 0) {
    r.kernels = bench::profile_kernels(
        [&] { train_step(step++); },
        cfg.profile_steps, (fs::path(cfg.workdir) / "colossus_trace.json").string());
  }
  if (device.is_cuda()) {
    const auto stats = at::accelerator::getDeviceStats(device.index());
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    r.peak_allocated_gib = static_cast<double>(stats.allocated_bytes[aggregate].peak) / kGiB;
    r.peak_reserved_gib = static_cast<double>(stats.reserved_bytes[aggregate].peak) / kGiB;
    // A captured step's activations live in the graph's private pool, which
    // the allocator counts as reserved but not allocated between replays:
    // report the reserved peak, an upper bound, so the figure is not flattered.
    if (graph) r.peak_allocated_gib = r.peak_reserved_gib;
  }
  return r;
}

// N for MFU: parameters without the position embedding; the tied head is not
// a parameter of its own, so wte counts once.
// The parameters a token's matmuls touch: without GPT-2's position
// embedding, and of an MoE model's routed experts only the top-k share (the
// active parameters).
int64_t flop_params(const models::ModelConfig& model_config) {
  auto meta = models::create_model(model_config, {.device = c10::kMeta, .init = false});
  const double routed_share = std::visit(
      [](const auto& c) -> double {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, models::MixtralConfig>) {
          return static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_local_experts);
        } else if constexpr (std::is_same_v<C, models::DeepseekConfig>) {
          return static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.n_routed_experts);
        } else {
          return 1.0;
        }
      },
      model_config);
  double n = 0;
  for (const auto& item : meta->named_parameters(/*recurse=*/true)) {
    if (item.key().ends_with("wpe.weight")) continue;
    const bool routed = item.key().find(".experts.") != std::string::npos;
    n += static_cast<double>(item.value().numel()) * (routed ? routed_share : 1.0);
  }
  return static_cast<int64_t>(n);
}

json result_json(const Result& r, double mfu) {
  return {{"ms_per_step", r.ms_per_step},          {"tokens_per_s", r.tokens_per_s},
          {"mfu", mfu},                            {"peak_allocated_gib", r.peak_allocated_gib},
          {"peak_reserved_gib", r.peak_reserved_gib}, {"losses", r.losses},
          {"phases_device_ms", r.phases.device_ms}, {"phases_host_ms", r.phases.host_ms},
          {"kernels", bench::kernels_json(r.kernels)}};
}

// Device ms per step by kernel category, ours (and our FP8 step's, with
// --fp8) beside each profiled peer, then our top kernels and the fastest
// peer's.
void print_kernel_breakdown(const Result& ours, const std::map<std::string, json>& peers,
                            const std::optional<Result>& fp8) {
  std::map<std::string, std::vector<bench::KernelStat>> runs = {{"colossus", ours.kernels}};
  if (fp8 && !fp8->kernels.empty()) runs["colossus-fp8"] = fp8->kernels;
  for (const auto& [variant, p] : peers) {
    if (p.contains("kernels")) runs[variant] = bench::kernels_from_json(p["kernels"]);
  }
  std::map<std::string, std::map<std::string, double>> categories;
  std::vector<std::string> names;
  for (const auto& [run, kernels] : runs) {
    categories[run] = bench::by_category(kernels);
    for (const auto& [category, ms] : categories[run]) {
      if (std::find(names.begin(), names.end(), category) == names.end()) names.push_back(category);
    }
  }
  fmt::print("\ndevice ms per step by kernel category (Kineto; categories guessed from kernel names):\n| category |");
  for (const auto& [run, kernels] : runs) fmt::print(" {} |", run);
  fmt::print("\n|---|");
  for (size_t i = 0; i < runs.size(); ++i) fmt::print("---|");
  fmt::print("\n");
  names.push_back("total");
  for (const auto& category : names) {
    fmt::print("| {} |", category);
    for (const auto& [run, kernels] : runs) {
      double ms = 0;
      if (category == "total") {
        for (const auto& [c, v] : categories[run]) ms += v;
      } else if (categories[run].contains(category)) {
        ms = categories[run][category];
      }
      fmt::print(" {:.2f} |", ms);
    }
    fmt::print("\n");
  }
  auto top = [](const std::string& run, const std::vector<bench::KernelStat>& kernels) {
    fmt::print("\ntop kernels, {} (device ms per step, calls per step, category):\n", run);
    for (size_t i = 0; i < kernels.size() && i < 25; ++i) {
      std::string name = kernels[i].name.substr(0, 110);
      fmt::print("  {:7.2f} ms {:6.0f}x  {:<14} {}\n", kernels[i].device_ms, kernels[i].calls,
                 bench::kernel_category(kernels[i].name), name);
    }
  };
  top("colossus", ours.kernels);
  for (const auto& [run, kernels] : runs) {
    if (run.starts_with("compile") || run == "colossus-fp8") top(run, kernels);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const Config cfg = parse(argc, argv);
  if (cfg.device == "cuda" && !at::hasCUDA()) {
    fmt::print(stderr, "bench_train_gpt2 needs CUDA: this program has no CUDA device (build with "
                       "-DCOLOSSUS_CUDA=ON and run on a GPU machine; --device cpu runs a small smoke test)\n");
    return 2;
  }
  const c10::Device device = cfg.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  models::ModelConfig model_config = models::preset(cfg.model);
  if (auto* llama = std::get_if<models::LlamaConfig>(&model_config)) {
    // RoPE learns nothing per position: a longer --seq (32K) only widens the
    // table, for the peers' saved config too.
    llama->max_position_embeddings = std::max(llama->max_position_embeddings, cfg.seq);
  }
  const int64_t n_params = flop_params(model_config);
  const int64_t layers = models::num_layers(model_config), width = models::hidden_size(model_config);
  const double flops_per_token = 6.0 * static_cast<double>(n_params) + 6.0 * static_cast<double>(layers * width * cfg.seq);
  auto mfu = [&](double tokens_per_s) { return flops_per_token * tokens_per_s / 989e12; };
  std::string gpu = "cpu";
  if (device.is_cuda()) {
    const auto info = colossus::probe_accelerator();
    gpu = info && !info->devices.empty() ? info->devices[0].name : "cuda";
  }
  const std::string config = fmt::format(
      "{} ({:.1f}M params for FLOPs), B={} T={}, bf16 compute + fp32 master weights, AdamW lr=6e-4 betas=(0.9,0.95) "
      "wd=0.1, {} warm-up + {} timed steps, random tokens (seed {}, {} batches cycled){}",
      cfg.model, static_cast<double>(n_params) / 1e6, cfg.batch, cfg.seq, cfg.warmup, cfg.steps, cfg.seed, cfg.batches,
      cfg.checkpoint == "none" ? std::string()
                               : fmt::format(", every block checkpointed ({}; the peers: transformers' gradient "
                                             "checkpointing of whole layers)",
                                             cfg.checkpoint));
  fmt::print("{}\ndevice: {}\n", config, gpu);

  // Random batches, saved for the peers (int32, (batches, B, T), little-endian)
  // and kept on the device as int64 for us.
  const fs::path workdir = cfg.workdir;
  fs::create_directories(workdir);
  const fs::path data_path = workdir / "batches.i32";
  const fs::path init_dir = cfg.peers.empty() ? fs::path() : workdir / "init";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(cfg.seed);
  const at::Tensor tokens = at::randint(models::vocab_size(model_config), {cfg.batches, cfg.batch, cfg.seq}, gen);
  {
    const at::Tensor i32 = tokens.to(at::kInt).contiguous();
    std::ofstream out(data_path, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(i32.data_ptr()), static_cast<std::streamsize>(i32.nbytes()));
    if (!out) throw std::runtime_error("cannot write " + data_path.string());
  }

  // `ours` is the CUDA-graph step unless graphs are off; with `both` the
  // eager step runs first and keeps its own row.
  Result ours;
  std::optional<Result> eager;
  {
    const at::Tensor data = tokens.to(device);
    if (cfg.cuda_graph == "both") {
      eager = train_colossus(cfg, model_config, device, data, fs::path(), /*graphed=*/false);
      at::accelerator::emptyCache();
      fmt::print("colossus, eager step: {:.0f} tok/s, {:.1f} ms/step, peak {:.2f} GiB allocated\n", eager->tokens_per_s,
                 eager->ms_per_step, eager->peak_allocated_gib);
    }
    ours = train_colossus(cfg, model_config, device, data, init_dir, /*graphed=*/cfg.cuda_graph != "off");
  }
  // FP8 linear layers, same init and batches, the same kind of step as `ours`.
  std::optional<Result> fp8, fp8_fused;
  if (!cfg.fp8.empty()) {
    if (device.is_cuda()) at::accelerator::emptyCache();
    const at::Tensor data = tokens.to(device);
    fp8 = train_colossus(cfg, model_config, device, data, fs::path(), /*graphed=*/cfg.cuda_graph != "off",
                         models::Fp8Recipe{.rowwise = cfg.fp8 == "rowwise", .fused_quantize = false});
    double worst = 0;
    const size_t steps = std::min({ours.losses.size(), fp8->losses.size(), static_cast<size_t>(cfg.check_steps)});
    for (size_t i = 0; i < steps; ++i) {
      worst = std::max(worst, std::abs(fp8->losses[i] - ours.losses[i]) / std::abs(ours.losses[i]));
    }
    fmt::print("colossus fp8 ({}): {:.0f} tok/s, {:.1f} ms/step = {:.3f}x the bf16 step; peak {:.2f} GiB; max rel loss "
               "diff to bf16 over the first {} steps {:.2e}; last loss {:.4f} vs {:.4f}\n",
               cfg.fp8, fp8->tokens_per_s, fp8->ms_per_step, fp8->tokens_per_s / ours.tokens_per_s,
               fp8->peak_allocated_gib, steps, worst, fp8->losses.back(), ours.losses.back());
    if (device.is_cuda() && colossus::kernels::cuda_slots().fp8_quantize != nullptr) {
      at::accelerator::emptyCache();
      fp8_fused = train_colossus(cfg, model_config, device, data, fs::path(), /*graphed=*/cfg.cuda_graph != "off",
                                 models::Fp8Recipe{.rowwise = cfg.fp8 == "rowwise", .fused_quantize = true});
      // The quantised bytes are the same (the self-test); the runs may still
      // part in the last bits through nondeterministic kernels (the flash
      // attention backward's atomics), so the distance is printed beside the
      // FP8-to-bf16 one.
      double apart = 0;
      const size_t common = std::min({fp8->losses.size(), fp8_fused->losses.size(), steps});
      for (size_t i = 0; i < common; ++i) {
        apart = std::max(apart, std::abs(fp8_fused->losses[i] - fp8->losses[i]) / std::abs(fp8->losses[i]));
      }
      fmt::print("colossus fp8 ({}, fused quantise): {:.0f} tok/s, {:.1f} ms/step = {:.3f}x the bf16 step, {:.3f}x the "
                 "ATen-quantise fp8 step; losses {} the ATen-quantise run's (max rel diff {:.2e} over {} steps, FP8 "
                 "to bf16 {:.2e})\n",
                 cfg.fp8, fp8_fused->tokens_per_s, fp8_fused->ms_per_step, fp8_fused->tokens_per_s / ours.tokens_per_s,
                 fp8_fused->tokens_per_s / fp8->tokens_per_s,
                 fp8_fused->losses == fp8->losses ? "equal to" : "differ from", apart, common, worst);
    }
  }
  // Our cached blocks go back to the driver, so the peers' processes have the card.
  if (device.is_cuda()) at::accelerator::emptyCache();
  fmt::print("colossus{}: {:.0f} tok/s, {:.1f} ms/step, MFU {:.1f}%, peak {:.2f} GiB allocated\n",
             cfg.cuda_graph != "off" ? ", CUDA-graph step" : "", ours.tokens_per_s, ours.ms_per_step,
             100 * mfu(ours.tokens_per_s), ours.peak_allocated_gib);
  if (eager) {
    // The first check_steps, as for the peers: random tokens at this lr make
    // later steps chaotic, so run-to-run noise (cuDNN's backward accumulates
    // with atomics) grows to percent level there for any two runs.
    double worst = 0;
    const size_t steps = std::min({ours.losses.size(), eager->losses.size(), static_cast<size_t>(cfg.check_steps)});
    for (size_t i = 0; i < steps; ++i) {
      worst = std::max(worst, std::abs(ours.losses[i] - eager->losses[i]) / std::abs(eager->losses[i]));
    }
    fmt::print("CUDA-graph step vs eager step, same init and batches: max rel loss diff {:.2e} over the first {} "
               "steps: {}\n",
               worst, steps, worst <= 1e-2 ? "PASS (<= 1e-2)" : "FAIL (> 1e-2)");
  }
  std::fflush(stdout);

  // The peers, one process each (a torch.compile failure costs only its row).
  const fs::path repo = colossus::bench::repo_root();
  std::string python = cfg.python;
  if (python.empty()) python = fs::exists(repo / ".venv/bin/python") ? (repo / ".venv/bin/python").string() : "python3";
  std::map<std::string, json> peers;
  for (const auto& variant : cfg.peers) {
    // Untrimmed: a failed peer's output is echoed as it came.
    const std::string out = colossus::bench::run_command(fmt::format(
        "timeout {} '{}' '{}' --init '{}' --data '{}' --batch {} --seq {} --steps {} --warmup {} --phase-steps {} --variant {} "
        "--device {} --profile-steps {} --checkpoint {}",
        cfg.peer_timeout_s, python, (repo / "bench/bench_train_gpt2.py").string(), init_dir.string(), data_path.string(), cfg.batch,
        cfg.seq, cfg.steps, cfg.warmup, cfg.phase_steps, variant, cfg.device, cfg.profile_steps,
        cfg.checkpoint == "none" ? "none" : "full"),
        /*trim=*/false);
    const size_t brace = out.rfind("\n{");
    try {
      peers[variant] = json::parse(out.substr(brace == std::string::npos ? 0 : brace + 1));
      const json& p = peers[variant];
      fmt::print("{}: {:.0f} tok/s, {:.1f} ms/step\n", variant, p.at("tokens_per_s").get<double>(),
                 p.at("ms_per_step").get<double>());
    } catch (const std::exception& e) {
      fmt::print(stderr, "peer {} gave no result ({}); its output:\n{}\n", variant, e.what(), out);
    }
    std::fflush(stdout);
  }

  // Correctness: same init, same batches, so the first losses must agree to
  // bf16 rounding (the kernels differ, so not bit for bit).
  json check = json::object();
  const std::string reference = peers.contains("eager-amp") ? "eager-amp" : (peers.empty() ? "" : peers.begin()->first);
  if (!reference.empty()) {
    const auto theirs = peers[reference].at("losses").get<std::vector<double>>();
    double worst = 0;
    fmt::print("\nloss, first {} steps (same init and batches): colossus vs {}\n", cfg.check_steps, reference);
    fmt::print("| step | colossus | {:>10} | rel diff |\n|------|----------|------------|----------|\n", reference);
    for (int i = 0; i < cfg.check_steps && i < static_cast<int>(theirs.size()); ++i) {
      const double rel = std::abs(ours.losses[i] - theirs[i]) / std::abs(theirs[i]);
      worst = std::max(worst, rel);
      fmt::print("| {:4} | {:8.4f} | {:10.4f} | {:8.1e} |\n", i + 1, ours.losses[i], theirs[i], rel);
    }
    const bool pass = worst <= 1e-2;
    fmt::print("max relative difference {:.2e}: {}\n", worst, pass ? "PASS (<= 1e-2)" : "FAIL (> 1e-2)");
    check = {{"reference", reference}, {"steps", cfg.check_steps}, {"max_rel_diff", worst}, {"pass", pass}};
  }

  fmt::print("\nwhere a colossus step goes ({} steps with marks; device ms by CUDA events, host ms to issue):\n",
             cfg.phase_steps);
  for (const std::string name : {"forward+loss", "backward", "optimizer", "step"}) {
    if (!ours.phases.device_ms.contains(name)) continue;
    fmt::print("  {:<13} device {:8.2f} ms   host {:8.2f} ms", name, ours.phases.device_ms[name],
               ours.phases.host_ms[name]);
    if (peers.contains("eager-amp") && peers["eager-amp"].contains("phases_device_ms") &&
        peers["eager-amp"]["phases_device_ms"].contains(name)) {
      fmt::print("   (eager-amp device {:8.2f} ms)", peers["eager-amp"]["phases_device_ms"][name].get<double>());
    }
    fmt::print("\n");
  }

  if (cfg.profile_steps > 0) print_kernel_breakdown(ours, peers, fp8_fused ? fp8_fused : fp8);

  const std::string workload = fmt::format("{} B={} T={} bf16", cfg.model, cfg.batch, cfg.seq);
  fmt::print("\n| {:<28} | {:<38} | {:>9} | {:>8} | {:>6} | {:>9} | {:>15} |\n", "workload", "impl", "tok/s",
             "ms/step", "MFU", "peak GiB", "colossus/peer");
  fmt::print("|{:-<30}|{:-<40}|{:->11}|{:->10}|{:->8}|{:->11}|{:->17}|\n", "", "", "", "", "", "", "");
  if (eager) {
    fmt::print("| {:<28} | {:<38} | {:9.0f} | {:8.1f} | {:5.1f}% | {:9.2f} | {:>15} |\n", workload,
               "colossus, eager step", eager->tokens_per_s, eager->ms_per_step, 100 * mfu(eager->tokens_per_s),
               eager->peak_allocated_gib, "");
  }
  fmt::print("| {:<28} | {:<38} | {:9.0f} | {:8.1f} | {:5.1f}% | {:9.2f} | {:>15} |\n", workload,
             cfg.cuda_graph != "off" ? "colossus, CUDA-graph step" : "colossus (MixedPrecision+HybridAdam)",
             ours.tokens_per_s, ours.ms_per_step, 100 * mfu(ours.tokens_per_s), ours.peak_allocated_gib, "");
  if (fp8) {
    fmt::print("| {:<28} | {:<38} | {:9.0f} | {:8.1f} | {:5.1f}% | {:9.2f} | {:>15} |\n", workload,
               fmt::format("colossus, fp8 {} (vs bf16 {:.3f}x)", cfg.fp8, fp8->tokens_per_s / ours.tokens_per_s),
               fp8->tokens_per_s, fp8->ms_per_step, 100 * mfu(fp8->tokens_per_s), fp8->peak_allocated_gib, "");
  }
  if (fp8_fused) {
    fmt::print("| {:<28} | {:<38} | {:9.0f} | {:8.1f} | {:5.1f}% | {:9.2f} | {:>15} |\n", workload,
               fmt::format("colossus, fp8 {} fused quantise ({:.3f}x)", cfg.fp8, fp8_fused->tokens_per_s / ours.tokens_per_s),
               fp8_fused->tokens_per_s, fp8_fused->ms_per_step, 100 * mfu(fp8_fused->tokens_per_s),
               fp8_fused->peak_allocated_gib, "");
  }
  for (const auto& [variant, p] : peers) {
    const double tps = p.at("tokens_per_s").get<double>();
    fmt::print("| {:<28} | {:<38} | {:9.0f} | {:8.1f} | {:5.1f}% | {:9.2f} | {:15.2f} |\n", workload,
               p.value("impl", variant), tps, p.at("ms_per_step").get<double>(), 100 * mfu(tps),
               p.value("peak_allocated_gib", 0.0), ours.tokens_per_s / tps);
  }

  if (!cfg.json_path.empty()) {
    json peers_json = json::object();
    for (auto [variant, p] : peers) {
      p["mfu"] = mfu(p.at("tokens_per_s").get<double>());
      peers_json[variant] = p;
    }
    const json all = {{"bench", "train_gpt2"}, {"config", config},  {"workload", workload},
                      {"device", gpu},         {"command", cfg.command}, {"flops_per_token", flops_per_token},
                      {"colossus", result_json(ours, mfu(ours.tokens_per_s))},
                      {"colossus_eager", eager ? result_json(*eager, mfu(eager->tokens_per_s)) : json()},
                      {"colossus_fp8", fp8 ? result_json(*fp8, mfu(fp8->tokens_per_s)) : json()},
                      {"colossus_fp8_fused_quantize",
                       fp8_fused ? result_json(*fp8_fused, mfu(fp8_fused->tokens_per_s)) : json()},
                      {"fp8_recipe", cfg.fp8},
                      {"cuda_graph", cfg.cuda_graph}, {"peers", peers_json},
                      {"loss_check", check}};
    std::ofstream(cfg.json_path) << all.dump(2) << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_train_gpt2: {}\n", e.what());
  return 1;
}
