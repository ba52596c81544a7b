// How large a model one GPU trains, and how fast, with (a) plain bf16 AdamW
// (bf16 weights and gradients, fp32 masters and moments, all on the device:
// HybridAdam's fused CUDA step under MixedPrecisionOptimizer), (b) Gemini with
// a static placement that offloads every chunk's optimizer side (fp32 master,
// gradient shard, moments) to pinned host memory, and (c) Gemini's auto
// placement (as many chunks on the device as fit after the warm-up step, the
// optimizer side too, into the margin the traced warm-up peak leaves:
// gpu_margin_mem_ratio unset, the default); on request (d)
// gemini_nvme, (b) with every host chunk's moments in NVMe offload files
// under --nvme-dir between steps (what the NVMe tier costs in speed and saves
// in host bytes on this machine's disk). (b)'s CPU Adam overlaps the next
// forward and its gradient copies run beside backward.
//
// Every try runs in its own process (`--probe`), so an out-of-memory error,
// CUDA's or the host's OOM killer, cannot poison the next try. The driver:
//   1. throughput: each mode trains the mid-size model (llama-1b-like) from the
//      same weights on the same batches; the first step's loss must agree with
//      (a)'s within bf16 tolerance, then tokens/s and the ratio to (a);
//   2. capacity: per mode, a ladder of LLaMA-7B-shaped models (d 4096, ffn
//      11008, 32 heads) with more or fewer layers, until the largest that
//      trains 3 steps with finite losses is pinned down to --layer-step.
// Prints one table per part; appends to bench/RESULTS.md and results.jsonl.
//
// Usage: bench_gemini_capacity [--parts throughput,capacity] [--modes adamw,gemini_offload,gemini_auto]
//          [--start adamw=40,gemini_offload=32,gemini_auto=56] [--layer-step 4] [--budget-s 420]
//          [--try-timeout-s 240] [--device cuda|cpu] [--commit SHA] [--no-record] [--margin-ratio R]
//          [--accum 1,4,8 (throughput: a table block per gradient accumulation)] [--nvme-dir DIR]
//        bench_gemini_capacity --probe MODE --layers L [--hidden 4096 --ffn 11008 --heads 32 --vocab 32000]
//          [--batch 1 --seq 1024 --steps 3 --warmup 1 --accum 1] [--device cuda|cpu]
// --device cpu is a smoke test of the whole flow on tiny models (CI machine).
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <unistd.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster.h"
#include "colossus/booster/gemini_plugin.h"
#include "colossus/cluster/launch.h"
#include "colossus/metrics/memory.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/lazy_init.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/zero/gemini/gemini_ddp.h"
#include "colossus/zero/gemini/gemini_optimizer.h"

using namespace colossus;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
using Clock = std::chrono::steady_clock;

struct Shape {
  int64_t layers = 32, hidden = 4096, ffn = 11008, heads = 32, vocab = 32000;
  int64_t batch = 1, seq = 1024, steps = 3, warmup = 1;
  int64_t accum = 1;  // micro-batches a step (gradient accumulation)
};

struct Options {
  std::string probe_mode;  // non-empty: run one try and print its JSON line
  Shape shape;
  std::string device = "cuda";
  std::vector<std::string> parts = {"throughput", "capacity"};
  std::vector<std::string> modes = {"adamw", "gemini_offload", "gemini_auto"};
  std::map<std::string, int64_t> start = {{"adamw", 40}, {"gemini_offload", 32}, {"gemini_auto", 52}};
  std::vector<int64_t> accums = {1};  // throughput: gradient accumulation steps, a table block each
  int64_t layer_step = 4;
  double budget_s = 420;
  int try_timeout_s = 240;
  std::string commit;
  bool record = true;
  bool bound = false;
  std::string nvme_dir = (fs::temp_directory_path() / "colossus_bench_nvme").string();  // gemini_nvme's files
  double margin_ratio = -1.0;  // gemini_auto's gpu_margin_mem_ratio (< 0: the plugin's default)  // probe: also time the phases and measure the link and host Adam bandwidths
  std::string self;  // argv[0], to spawn probes
  std::string command = "bench_gemini_capacity";
};

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  o.self = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    o.command += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value (see the usage at the top of the file)");
      o.command += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    auto next_int = [&] { return std::stoll(next()); };
    if (a == "--probe") o.probe_mode = next();
    else if (a == "--layers") o.shape.layers = next_int();
    else if (a == "--hidden") o.shape.hidden = next_int();
    else if (a == "--ffn") o.shape.ffn = next_int();
    else if (a == "--heads") o.shape.heads = next_int();
    else if (a == "--vocab") o.shape.vocab = next_int();
    else if (a == "--batch") o.shape.batch = next_int();
    else if (a == "--seq") o.shape.seq = next_int();
    else if (a == "--steps") o.shape.steps = next_int();
    else if (a == "--warmup") o.shape.warmup = next_int();
    else if (a == "--accum") {
      o.accums.clear();
      for (const auto& item : split(next(), ',')) o.accums.push_back(std::stoll(item));
      if (o.accums.empty()) throw std::runtime_error("--accum needs at least one value");
      for (int64_t a : o.accums)
        if (a < 1) throw std::runtime_error("--accum " + std::to_string(a) + ": micro-batches a step must be >= 1");
      o.shape.accum = o.accums.front();
    }
    else if (a == "--device") o.device = next();
    else if (a == "--parts") o.parts = split(next(), ',');
    else if (a == "--modes") o.modes = split(next(), ',');
    else if (a == "--start") {
      for (const auto& kv : split(next(), ',')) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos) throw std::runtime_error("--start takes mode=layers,...; got '" + kv + "'");
        o.start[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
      }
    } else if (a == "--layer-step") o.layer_step = next_int();
    else if (a == "--budget-s") o.budget_s = std::stod(next());
    else if (a == "--try-timeout-s") o.try_timeout_s = static_cast<int>(next_int());
    else if (a == "--commit") o.commit = next();
    else if (a == "--no-record") o.record = false;
    else if (a == "--bound") o.bound = true;
    else if (a == "--margin-ratio") o.margin_ratio = std::stod(next());
    else if (a == "--nvme-dir") o.nvme_dir = next();
    else throw std::runtime_error("unknown argument '" + a + "' (see the usage at the top of bench_gemini_capacity.cpp)");
  }
  for (const auto& m : o.modes) {
    if (m != "adamw" && m != "gemini_offload" && m != "gemini_auto" && m != "gemini_nvme")
      throw std::runtime_error("mode '" + m +
                               "' is not one of adamw, gemini_offload, gemini_auto, gemini_nvme");
  }
  if (o.device != "cuda" && o.device != "cpu") throw std::runtime_error("--device is '" + o.device + "'; use cuda or cpu");
  return o;
}

models::ModelConfig llama(const Shape& s) {
  models::LlamaConfig c;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.ffn;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.max_position_embeddings = s.seq;
  return c;
}

// Initial values without a per-parameter random draw (a 13B model's seeded
// init alone would take minutes of one CPU core): norms are ones, every other
// tensor a window of one shared N(0, 0.02) pool at an offset derived from its
// name. Deterministic, so every mode starts from the same weights.
models::ParamSource pool_source(int64_t largest_numel) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  const int64_t pool_numel = largest_numel + (1 << 20);
  auto pool = std::make_shared<at::Tensor>(at::empty({pool_numel}, at::kFloat).normal_(0.0, 0.02, gen));
  return [pool](const std::string& name, const at::Tensor& param) -> at::Tensor {
    if (name.find("norm") != std::string::npos) return at::ones(param.sizes(), at::kFloat);
    const int64_t numel = param.numel();
    const int64_t span = pool->numel() - numel;
    const int64_t offset = static_cast<int64_t>(std::hash<std::string>{}(name) % static_cast<size_t>(span));
    return pool->narrow(0, offset, numel).view(param.sizes());
  };
}

void sync(const c10::Device& device) {
  if (device.is_cuda()) at::accelerator::synchronizeDevice(device.index());
}

double peak_device_gib(const c10::Device& device) {
  if (!device.is_cuda()) return 0.0;
  const auto stats = at::accelerator::getDeviceStats(device.index());
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<double>(stats.reserved_bytes[aggregate].peak) / kGiB;
}

// GB/s of pinned host <-> device copies of 256 MiB (the bound's PCIe term).
std::pair<double, double> link_gbs(const c10::Device& device) {
  const int64_t n = int64_t{256} << 20;
  at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  at::Tensor dev = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(device));
  auto time = [&](auto&& copy) {
    copy();
    sync(device);
    const auto t0 = Clock::now();
    for (int i = 0; i < 3; ++i) copy();
    sync(device);
    return 3.0 * static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  };
  const double h2d = time([&] { dev.copy_(host, /*non_blocking=*/true); });
  const double d2h = time([&] { host.copy_(dev, /*non_blocking=*/true); });
  return {h2d, d2h};
}

// GB/s of the host step's fused CPU Adam (HybridAdam::step_host_mixed, all
// cores) over 64M elements, counting its 28 bytes a parameter: fp32 master,
// both moments read and written, the bf16 gradient read and parameter written.
double host_adam_gbs() {
  const int64_t n = int64_t{64} << 20;
  at::Tensor master = at::zeros({n}, at::kFloat);
  at::Tensor io = at::zeros({n}, at::kBFloat16);
  optim::HybridAdam adam(std::vector<at::Tensor>{master}, {.lr = 1e-4, .weight_decay = 0.1});
  adam.step_host_mixed({0}, {io}, 1.0f);
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) adam.step_host_mixed({0}, {io}, 1.0f);
  return 3.0 * 28.0 * static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

// One try: build, train warmup + steps, print a JSON line. Out of memory (or
// any error) is a result, not a crash.
int probe(const Options& o) {
  const Shape& s = o.shape;
  json r = {{"mode", o.probe_mode}, {"layers", s.layers}, {"hidden", s.hidden}, {"batch", s.batch}, {"seq", s.seq}};
  const auto t_start = Clock::now();
  try {
    const auto& cluster = cluster::launch_from_env({.backend = o.device == "cuda" ? "auto" : "mpi"});
    const c10::Device device = o.device == "cuda" ? cluster.device : c10::Device(c10::kCPU);
    const auto config = llama(s);
    auto model = models::create_lazy_model(config);
    int64_t params = 0, largest = 0;
    for (const auto& p : model->parameters()) {
      params += p.numel();
      largest = std::max(largest, p.numel());
    }
    r["params"] = params;
    const auto source = pool_source(largest);
    const optim::HybridAdamOptions adam{.lr = 3e-4, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.1, .adamw_mode = true};

    std::unique_ptr<booster::Booster> booster;
    booster::Boosted boosted;
    std::unique_ptr<amp::MixedPrecisionOptimizer> plain_opt;
    if (o.probe_mode == "adamw") {
      models::materialize(*model, source, device, at::kBFloat16);
      plain_opt = std::make_unique<amp::MixedPrecisionOptimizer>(
          std::make_unique<optim::HybridAdam>(model->parameters(), adam), amp::MixedPrecisionOptions{.precision = "bf16"});
    } else {
      booster::GeminiPluginOptions g{
          .gemini = {.placement_policy = o.probe_mode == "gemini_auto" ? "auto" : "static",
                     .offload_optim_frac = o.probe_mode == "gemini_offload" || o.probe_mode == "gemini_nvme" ? 1.0 : 0.0,
                     // auto: gpu_margin_mem_ratio's default (unset: the measured
                     // device margin for optimizer shards), what a user gets.
                     .precision = "bf16",
                     .pin_memory = device.is_cuda(),
                     .enable_gradient_accumulation = s.accum > 1},
          .hidden_dim = s.hidden};
      if (!device.is_cuda()) g.search_range_m = g.min_chunk_size_m = 1.0;
      if (o.probe_mode == "gemini_auto" && o.margin_ratio >= 0.0) g.gemini.gpu_margin_mem_ratio = o.margin_ratio;
      if (o.probe_mode == "gemini_nvme") {
        g.gemini.nvme_offload_fraction = 1.0;
        g.gemini.nvme_offload_dir = (fs::path(o.nvme_dir) / fmt::format("probe_{}", ::getpid())).string();
        r["nvme_dir"] = g.gemini.nvme_offload_dir;
      }
      booster = std::make_unique<booster::Booster>(std::make_shared<booster::GeminiPlugin>(g, cluster.world));
      boosted = booster->boost(model, std::make_unique<optim::HybridAdam>(model->parameters(), adam), nullptr, nullptr,
                               source);
    }
    r["init_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();

    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    const int64_t n_batches = 4;
    const at::Tensor data = at::randint(s.vocab, {n_batches, s.batch, s.seq}, gen, at::kLong).to(device);
    std::vector<at::Tensor> losses;
    Clock::time_point t0;
    for (int64_t step = 0; step < s.warmup + s.steps; ++step) {
      if (step == s.warmup) {
        sync(device);
        t0 = Clock::now();
      }
      // `accum` micro-batches, each loss scaled by 1/accum, then one step.
      at::Tensor step_loss;
      for (int64_t micro = 0; micro < s.accum; ++micro) {
        const at::Tensor ids = data[(step * s.accum + micro) % n_batches];
        at::Tensor loss = (plain_opt ? model->forward_loss(ids, ids) : boosted.model->forward_loss(ids, ids)) /
                          static_cast<double>(s.accum);
        if (plain_opt) {
          loss.backward();
        } else {
          booster->backward(loss, *boosted.optimizer);
        }
        step_loss = step_loss.defined() ? step_loss + loss.detach() : loss.detach();
      }
      if (plain_opt) {
        plain_opt->step();
        plain_opt->zero_grad(true);
      } else {
        boosted.optimizer->step();
        boosted.optimizer->zero_grad(true);
      }
      losses.push_back(step_loss);
    }
    sync(device);
    const double timed_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<double> values;
    bool finite = true;
    for (const auto& l : losses) {
      values.push_back(l.item<double>());
      finite = finite && std::isfinite(values.back());
    }
    r["losses"] = values;
    r["ok"] = finite;
    if (auto* gemini = dynamic_cast<zero::gemini::GeminiOptimizer*>(boosted.optimizer.get())) {
      // What each tier holds after the steps, in bytes a parameter (of the
      // whole model): device, host, NVMe; and the host's by kind.
      const auto m = gemini->memory_bytes();
      const double n = static_cast<double>(params);
      r["device_bytes_per_param"] = static_cast<double>(m.device_total()) / n;
      r["host_bytes_per_param"] = static_cast<double>(m.host_total()) / n;
      r["nvme_bytes_per_param"] = static_cast<double>(m.optim_nvme) / n;
      r["host_bytes"] = {{"params", m.params_host}, {"grads", m.grads_host}, {"masters", m.masters_host},
                         {"optimizer", m.optim_host}};
      int64_t host_chunks = 0, chunks = 0;
      for (const auto& chunk : gemini->ddp().chunks()) {
        host_chunks += chunk.placement.optim_on_host ? 1 : 0;
        ++chunks;
      }
      r["optim_on_host_chunks"] = fmt::format("{}/{}", host_chunks, chunks);
    }
    if (!finite) r["error"] = "non-finite loss";
    r["step_ms"] = timed_s * 1e3 / static_cast<double>(s.steps);
    r["tokens_per_s"] = static_cast<double>(s.batch * s.seq * s.accum * s.steps) / timed_s;
    r["accum"] = s.accum;
    if (o.bound && s.accum == 1) {
      // The phases of `steps` more steps, synchronised between forward +
      // backward and the optimizer step (kept out of the timed steps above).
      double fwd_bwd_s = 0.0, opt_s = 0.0;
      for (int64_t step = 0; step < s.steps; ++step) {
        const at::Tensor ids = data[step % n_batches];
        sync(device);
        const auto t_a = Clock::now();
        if (plain_opt) {
          model->forward_loss(ids, ids).backward();
        } else {
          booster->backward(boosted.model->forward_loss(ids, ids), *boosted.optimizer);
        }
        sync(device);
        const auto t_b = Clock::now();
        if (plain_opt) {
          plain_opt->step();
          plain_opt->zero_grad(true);
        } else {
          boosted.optimizer->step();
          boosted.optimizer->zero_grad(true);
          // The host step's CPU Adam runs on a worker and overlaps the next
          // forward; the phase table counts it in the optimizer's phase.
          if (auto* gemini = dynamic_cast<zero::gemini::GeminiOptimizer*>(boosted.optimizer.get())) {
            gemini->ddp().finish_host_updates();
          }
        }
        sync(device);
        fwd_bwd_s += std::chrono::duration<double>(t_b - t_a).count();
        opt_s += std::chrono::duration<double>(Clock::now() - t_b).count();
      }
      r["fwd_bwd_ms"] = fwd_bwd_s * 1e3 / static_cast<double>(s.steps);
      r["optimizer_ms"] = opt_s * 1e3 / static_cast<double>(s.steps);
      if (auto* gemini = dynamic_cast<zero::gemini::GeminiOptimizer*>(boosted.optimizer.get())) {
        int64_t host_chunks = 0;
        for (const auto& chunk : gemini->ddp().chunks()) host_chunks += gemini->ddp().host_steps(chunk) ? 1 : 0;
        r["host_step_chunks"] = host_chunks;
      }
      if (device.is_cuda()) {
        const auto [h2d, d2h] = link_gbs(device);
        r["h2d_gbs"] = h2d;
        r["d2h_gbs"] = d2h;
      }
      r["host_adam_gbs"] = host_adam_gbs();
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    r["ok"] = false;
    r["error"] = what.substr(0, what.find('\n')).substr(0, 300);
  }
  const c10::Device device = o.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  r["peak_device_gib"] = peak_device_gib(device);
  r["peak_host_gib"] = static_cast<double>(metrics::host_peak_rss_bytes()) / kGiB;
  if (r.contains("nvme_dir")) {
    std::error_code ignored;
    fs::remove_all(r["nvme_dir"].get<std::string>(), ignored);  // the try's files (the probe is done with them)
  }
  r["wall_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
  fmt::print("PROBE {}\n", r.dump());
  std::fflush(stdout);
  return 0;
}

// Runs one probe in a child process; a child that dies (host OOM killer,
// timeout) is reported as a failed try with its exit status.
json run_probe(const Options& o, const std::string& mode, const Shape& s, bool bound = false) {
  const std::string cmd = fmt::format(
      "timeout -s KILL {} {} --probe {} --layers {} --hidden {} --ffn {} --heads {} --vocab {} --batch {} --seq {} "
      "--steps {} --warmup {} --accum {} --device {} --margin-ratio {} --nvme-dir '{}'{} 2>&1; echo \"EXIT $?\"",
      o.try_timeout_s, o.self, mode, s.layers, s.hidden, s.ffn, s.heads, s.vocab, s.batch, s.seq, s.steps, s.warmup,
      s.accum, o.device, o.margin_ratio, o.nvme_dir, bound ? " --bound" : "");
  const std::string out = bench::run_command(cmd);
  const auto at = out.rfind("PROBE ");
  if (at != std::string::npos) {
    const auto end = out.find('\n', at);
    return json::parse(out.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6));
  }
  const auto exit_at = out.rfind("EXIT ");
  const std::string status = exit_at == std::string::npos ? "?" : out.substr(exit_at + 5);
  std::string why = status == "137" ? "killed (host out of memory, or the try timeout)" : "exited " + status;
  const auto tail_from = out.size() > 300 ? out.size() - 300 : 0;
  return {{"mode", mode}, {"layers", s.layers}, {"ok", false}, {"error", why}, {"log_tail", out.substr(tail_from)}};
}

std::string billions(int64_t params) { return fmt::format("{:.2f}B", static_cast<double>(params) / 1e9); }

struct Report {
  std::vector<std::string> md;  // table lines
  std::string jsonl;
};

void add_row(Report& rep, const Options& o, const std::string& machine, const std::string& config, const std::string& metric,
             double value, const std::string& peer, double peer_value) {
  rep.jsonl += json{{"date", bench::today()},
                    {"commit", bench::commit_or(o.commit)},
                    {"machine", machine},
                    {"bench", "gemini_capacity"},
                    {"config", config},
                    {"metric", metric},
                    {"value", value},
                    {"peer", peer},
                    {"peer_value", peer_value},
                    {"ratio", peer_value > 0 ? value / peer_value : 0.0}}
                   .dump() +
               "\n";
}

int drive(const Options& o) {
  const bool cuda = o.device == "cuda";
  const std::string machine = bench::machine_name(cuda);
  const auto t_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count(); };
  Report rep;
  bool all_ok = true;
  auto want = [&](const std::string& part) { return std::find(o.parts.begin(), o.parts.end(), part) != o.parts.end(); };

  if (want("throughput")) {
    // llama-1b-like (issue 9's workload) at B=8, T=2048; tiny on CPU.
    Shape mid{.layers = 16, .hidden = 2048, .ffn = 5632, .heads = 16, .vocab = 32000, .batch = 8, .seq = 2048, .steps = 5,
              .warmup = 2};
    if (!cuda) mid = Shape{.layers = 2, .hidden = 64, .ffn = 172, .heads = 4, .vocab = 512, .batch = 2, .seq = 64, .steps = 3, .warmup = 2};
    // A table block for each accumulation (micro-batches of B each); the
    // bound and the phases for the first block without accumulation.
    // The link and host-Adam speeds the first block measured, for the
    // accumulation blocks' bounds.
    struct OffloadRates {
      double params = 0, h2d_gbs = 0, d2h_gbs = 0, adam_gbs = 0;
    } offload_rates;
    for (const int64_t accum : o.accums) {
    mid.accum = accum;
    if (accum > 1) mid.warmup = 1, mid.steps = 3;
    std::map<std::string, json> res;
    for (const auto& m : o.modes) {
      res[m] = run_probe(o, m, mid, /*bound=*/accum == 1);
      fmt::print("throughput {} GA {}: {}\n", m, accum, res[m].dump());
      std::fflush(stdout);
    }
    const std::string config =
        fmt::format("llama d{} L{} ffn{} vocab{}, B={} T={}, bf16, AdamW{}", mid.hidden, mid.layers, mid.ffn, mid.vocab,
                    mid.batch, mid.seq, accum > 1 ? fmt::format(", gradient accumulation {}", accum) : "");
    rep.md.push_back(fmt::format("\nthroughput, {} ({} params):\n", config,
                                 billions(res.begin()->second.value("params", int64_t{0}))));
    rep.md.push_back("| mode | tokens/s | vs plain AdamW | step ms | fwd+bwd ms | optimizer ms | first loss | rel diff vs plain | peak device GiB | peak host GiB | ok |");
    rep.md.push_back("|---|---|---|---|---|---|---|---|---|---|---|");
    const json* plain = res.count("adamw") ? &res["adamw"] : nullptr;
    for (const auto& m : o.modes) {
      const json& r = res[m];
      const bool ok = r.value("ok", false);
      double first = ok ? r["losses"][0].get<double>() : NAN;
      double rel = NAN;
      if (ok && plain && plain->value("ok", false)) {
        const double ref = (*plain)["losses"][0].get<double>();
        rel = std::abs(first - ref) / std::abs(ref);
        // Same weights, same batches, bf16 compute on both sides: the first
        // loss, and the curve after it (an update from a gradient copy read
        // before it landed would leave it at once).
        const auto& losses = r["losses"];
        const auto& ref_losses = (*plain)["losses"];
        double worst = 0;
        for (size_t i = 0; i < std::min(losses.size(), ref_losses.size()); ++i) {
          const double a = losses[i].get<double>(), b = ref_losses[i].get<double>();
          worst = std::max(worst, std::abs(a - b) / std::abs(b));
        }
        if (rel > 2e-2 || worst > 2e-2) {
          all_ok = false;
          fmt::print("FAIL: {}'s losses leave plain AdamW's: first {} vs {} ({:.2e}), worst step {:.2e} (> 2e-2)\n", m,
                     first, ref, rel, worst);
        } else {
          fmt::print("{}: losses within {:.2e} of plain AdamW's over {} steps\n", m, worst,
                     std::min(losses.size(), ref_losses.size()));
        }
      }
      if (!ok) all_ok = false;
      const double tps = r.value("tokens_per_s", 0.0);
      const double peer = plain ? plain->value("tokens_per_s", 0.0) : 0.0;
      rep.md.push_back(fmt::format("| {} | {:.0f} | {:.2f}x | {:.1f} | {:.1f} | {:.1f} | {:.4f} | {:.1e} | {:.1f} | {:.1f} | {} |",
                                   m, tps, peer > 0 ? tps / peer : 0.0, r.value("step_ms", 0.0),
                                   r.value("fwd_bwd_ms", 0.0), r.value("optimizer_ms", 0.0), first, rel,
                                   r.value("peak_device_gib", 0.0), r.value("peak_host_gib", 0.0),
                                   ok ? "yes" : r.value("error", std::string("no"))));
      add_row(rep, o, machine, config + ", " + m, "tokens_per_s", tps, "plain bf16 AdamW (same run)", peer);
    }
    // Issue 27's bound for full offload: the step can not beat the largest of
    // the GPU's work (the plain step), the PCIe bytes (bf16 gradients down,
    // bf16 parameters up: 4 bytes a parameter) at the measured link speed,
    // and the CPU Adam's 28 bytes a parameter at its measured speed. Our
    // schedule runs the CPU Adam after backward (it needs the clip factor
    // and the finiteness of every chunk), overlapped with the next forward,
    // so the serial schedule (forward + backward, then the CPU Adam) is the
    // one it beats by at most the forward.
    if (accum == 1 && res.count("gemini_offload") && res["gemini_offload"].value("ok", false) && plain &&
        plain->value("ok", false)) {
      const json& r = res["gemini_offload"];
      const double n = static_cast<double>(r.value("params", int64_t{0}));
      const double gpu_ms = plain->value("step_ms", 0.0);
      const double h2d = r.value("h2d_gbs", 0.0), d2h = r.value("d2h_gbs", 0.0), adam = r.value("host_adam_gbs", 0.0);
      const double pcie_ms = h2d > 0 && d2h > 0 ? (2.0 * n / d2h + 2.0 * n / h2d) / 1e6 : 0.0;
      const double adam_ms = adam > 0 ? 28.0 * n / adam / 1e6 : 0.0;
      const double bound_ms = std::max({gpu_ms, pcie_ms, adam_ms});
      const double serial_ms = r.value("fwd_bwd_ms", 0.0) + adam_ms;
      const double step_ms = r.value("step_ms", 0.0);
      rep.md.push_back(fmt::format(
          "\nfull offload's bound: max(GPU {:.1f} ms (the plain step), PCIe {:.1f} ms (4 B/param at {:.1f} GB/s down, "
          "{:.1f} GB/s up), CPU Adam {:.1f} ms (28 B/param at {:.1f} GB/s)) = {:.1f} ms, {:.2f}x the plain step; "
          "measured {:.1f} ms = {:.2f}x that bound. Serial schedule (forward + backward, then the CPU Adam): {:.1f} ms; "
          "measured = {:.2f}x it. Host-step chunks: {}.",
          gpu_ms, pcie_ms, d2h, h2d, adam_ms, adam, bound_ms, gpu_ms / bound_ms, step_ms, step_ms / bound_ms, serial_ms,
          serial_ms > 0 ? step_ms / serial_ms : 0.0, r.value("host_step_chunks", int64_t{0})));
      add_row(rep, o, machine, config + ", gemini_offload", "step_ms_over_bound", step_ms / bound_ms,
              "max(GPU, PCIe, CPU Adam) bound (same run)", bound_ms);
      offload_rates = OffloadRates{.params = n, .h2d_gbs = h2d, .d2h_gbs = d2h, .adam_gbs = adam};
    }
    // What the NVMe tier adds: host bytes moved to files, and its speed
    // against the same offload with everything in host memory.
    if (res.count("gemini_nvme") && res["gemini_nvme"].value("ok", false) && res.count("gemini_offload") &&
        res["gemini_offload"].value("ok", false)) {
      const json& nv = res["gemini_nvme"];
      const json& off = res["gemini_offload"];
      const double tps = nv.value("tokens_per_s", 0.0), off_tps = off.value("tokens_per_s", 0.0);
      rep.md.push_back(fmt::format(
          "\nNVMe tier (every host chunk's moments in files under {} between steps): {:.1f} bytes a parameter in "
          "files, host {:.1f} bytes a parameter against {:.1f} with everything in host memory; {:.0f} tok/s = {:.2f}x "
          "gemini_offload's step (it takes the gradient-shard path: the host step keeps no state in files).",
          o.nvme_dir, nv.value("nvme_bytes_per_param", 0.0), nv.value("host_bytes_per_param", 0.0),
          off.value("host_bytes_per_param", 0.0), tps, off_tps > 0 ? tps / off_tps : 0.0));
      add_row(rep, o, machine, config + ", gemini_nvme", "tokens_per_s", tps, "gemini_offload (same run)", off_tps);
      add_row(rep, o, machine, config + ", gemini_nvme", "host_bytes_per_param", nv.value("host_bytes_per_param", 0.0),
              "gemini_offload (same run)", off.value("host_bytes_per_param", 0.0));
    }
    // With accumulation the bound takes the GPU's `accum` micro-batches, a
    // gradient down per micro-batch and the parameters up once, and on the
    // host the CPU Adam plus a sum of each landed gradient (10 bytes a
    // parameter, at the CPU Adam's measured speed).
    if (accum > 1 && offload_rates.adam_gbs > 0 && res.count("gemini_offload") &&
        res["gemini_offload"].value("ok", false) && plain && plain->value("ok", false)) {
      const auto& rates = offload_rates;
      const double a = static_cast<double>(accum), n = rates.params;
      const double gpu_ms = plain->value("step_ms", 0.0);
      const double pcie_ms = rates.h2d_gbs > 0 && rates.d2h_gbs > 0
                                 ? (a * 2.0 * n / rates.d2h_gbs + 2.0 * n / rates.h2d_gbs) / 1e6
                                 : 0.0;
      const double host_ms = (28.0 + a * 10.0) * n / rates.adam_gbs / 1e6;
      const double bound_ms = std::max({gpu_ms, pcie_ms, host_ms});
      const double step_ms = res["gemini_offload"].value("step_ms", 0.0);
      rep.md.push_back(fmt::format(
          "\nfull offload's bound with {} micro-batches: max(GPU {:.1f} ms (the plain step), PCIe {:.1f} ms, host "
          "{:.1f} ms (CPU Adam + {} gradient sums)) = {:.1f} ms, {:.2f}x the plain step; measured {:.1f} ms = {:.2f}x "
          "that bound.",
          accum, gpu_ms, pcie_ms, host_ms, accum, bound_ms, gpu_ms / bound_ms, step_ms, step_ms / bound_ms));
      add_row(rep, o, machine, config + ", gemini_offload", "step_ms_over_bound", step_ms / bound_ms,
              "max(GPU, PCIe, host) bound (same run)", bound_ms);
    }
    }  // accumulation blocks
  }

  if (want("capacity")) {
    Shape big{.layers = 0, .hidden = 4096, .ffn = 11008, .heads = 32, .vocab = 32000, .batch = 1, .seq = 1024, .steps = 3,
              .warmup = 0};
    if (!cuda) big = Shape{.layers = 0, .hidden = 64, .ffn = 172, .heads = 4, .vocab = 512, .batch = 1, .seq = 32, .steps = 3, .warmup = 0};
    const std::string config = fmt::format("llama d{} ffn{} heads{} vocab{}, B={} T={}, bf16, AdamW, {} steps", big.hidden,
                                           big.ffn, big.heads, big.vocab, big.batch, big.seq, big.steps);
    rep.md.push_back(fmt::format("\ncapacity, {} (layers varied; each try its own process):\n", config));
    rep.md.push_back("| mode | largest that trains | params | peak device GiB | peak host GiB | step s | bytes/param device, host (optimizer chunks on the host) | next size up | why it failed |");
    rep.md.push_back("|---|---|---|---|---|---|---|---|---|");
    std::map<std::string, int64_t> largest_params;
    for (const auto& m : o.modes) {
      std::map<int64_t, json> tries;
      auto attempt = [&](int64_t layers) -> bool {
        if (tries.count(layers)) return tries[layers].value("ok", false);
        Shape s = big;
        s.layers = layers;
        tries[layers] = run_probe(o, m, s);
        fmt::print("capacity {} L={}: {}\n", m, layers, tries[layers].dump());
        std::fflush(stdout);
        return tries[layers].value("ok", false);
      };
      // Walk from the start by 2 steps towards the boundary, then halve to
      // layer_step: `best` trains, `worst` does not.
      int64_t best = 0, worst = 0;
      int64_t l = cuda ? o.start.at(m) : 2;
      const int64_t stride = 2 * o.layer_step;
      while (elapsed() < o.budget_s && l >= 1) {
        if (attempt(l)) {
          best = l;
          if (worst && worst - best <= o.layer_step) break;
          l = worst ? (best + worst) / 2 : l + stride;
        } else {
          worst = l;
          if (best && worst - best <= o.layer_step) break;
          l = best ? (best + worst) / 2 : l - stride;
        }
        if (!cuda && l > 4) break;  // the CPU smoke test only checks the flow
      }
      const json* fit = best ? &tries[best] : nullptr;
      const json* fail = worst ? &tries[worst] : nullptr;
      largest_params[m] = fit ? fit->value("params", int64_t{0}) : 0;
      if (!fit) all_ok = false;
      const std::string tiers =
          fit && fit->contains("host_bytes_per_param")
              ? fmt::format("{:.1f}, {:.1f} ({})", fit->value("device_bytes_per_param", 0.0),
                            fit->value("host_bytes_per_param", 0.0), fit->value("optim_on_host_chunks", std::string()))
              : "-";
      rep.md.push_back(fmt::format(
          "| {} | {} layers | {} | {:.1f} | {:.1f} | {:.2f} | {} | {} | {} |", m, best,
          fit ? billions(fit->value("params", int64_t{0})) : "-", fit ? fit->value("peak_device_gib", 0.0) : 0.0,
          fit ? fit->value("peak_host_gib", 0.0) : 0.0, fit ? fit->value("step_ms", 0.0) / 1e3 : 0.0, tiers,
          fail ? fmt::format("{} layers", worst) : "not reached", fail ? fail->value("error", std::string("")) : ""));
    }
    for (const auto& m : o.modes) {
      const double peer = largest_params.count("adamw") ? static_cast<double>(largest_params["adamw"]) : 0.0;
      add_row(rep, o, machine, config + ", " + m, "largest_trainable_params", static_cast<double>(largest_params[m]),
              "plain bf16 AdamW (same run)", peer);
    }
  }

  fmt::print("\nGemini capacity and throughput on {}:\n", machine);
  for (const auto& line : rep.md) fmt::print("{}\n", line);
  if (o.record && cuda) {
    std::string section = fmt::format("\n## gemini_capacity — {}\n\nmachine: {}; commit {}; torch {}\ncommand: `{}`\n",
                                      bench::today(), machine, bench::commit_or(o.commit), TORCH_VERSION, o.command);
    for (const auto& line : rep.md) section += line + "\n";
    bench::append_file("bench/RESULTS.md", section);
    bench::append_file("bench/results.jsonl", rep.jsonl);
    fmt::print("\nappended to bench/RESULTS.md and bench/results.jsonl\n");
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  if (o.device == "cuda" && !at::hasCUDA()) {
    fmt::print(stderr, "bench_gemini_capacity needs CUDA (build with -DCOLOSSUS_CUDA=ON on a GPU machine); "
                       "--device cpu runs a small smoke test\n");
    return 2;
  }
  return o.probe_mode.empty() ? drive(o) : probe(o);
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_gemini_capacity: {}\n", e.what());
  return 1;
}
