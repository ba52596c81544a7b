// CPU Adam step on 100M fp32 parameters: HybridAdam's fused SIMD kernel
// (colossus/kernels/adam.h, the call HybridAdam makes for CPU fp32 params)
// against torch in the same run (bench/bench_cpu_adam.py): torch.optim.AdamW
// with foreach=True and with fused=True. (torch::optim::AdamW in C++ is left
// out: bench targets do not see torch's csrc/api headers; its per-op loop is
// what foreach=False does in Python.)
// Adam is memory-bound: a fused step moves 28 bytes per parameter (reads p, g,
// m, v; writes p, m, v), so the roofline is 28 * numel / memcpy bandwidth.
// Prints a table; appends to bench/RESULTS.md and bench/results.jsonl.
//
// Usage: bench_cpu_adam [--numel N] [--tensors K] [--steps S] [--warmup W]
//                       [--rounds R] [--threads T] [--no-python] [--no-record]
#include "bench/bench_common.h"
#include "colossus/kernels/adam.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace bench = colossus::bench;
using colossus::kernels::CpuIsa;

struct Config {
  int64_t numel = 100'000'000;
  int64_t tensors = 4;
  int steps = 7;
  int warmup = 2;
  int rounds = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool python = true;
  bool record = true;
  std::string command;
};

Config parse(int argc, char** argv) {
  Config c;
  c.command = "bench_cpu_adam";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    c.command += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      c.command += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--numel") c.numel = std::stoll(next());
    else if (a == "--tensors") c.tensors = std::stoll(next());
    else if (a == "--steps") c.steps = std::stoi(next());
    else if (a == "--warmup") c.warmup = std::stoi(next());
    else if (a == "--rounds") c.rounds = std::stoi(next());
    else if (a == "--threads") c.threads = std::stoi(next());
    else if (a == "--no-python") c.python = false;
    else if (a == "--no-record") c.record = false;
    else throw std::runtime_error("unknown flag " + a + " (see the usage at the top of bench_cpu_adam.cpp)");
  }
  return c;
}

double median_ms(int warmup, int steps, const std::function<void()>& step) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

constexpr const char* kStream = "stream (same traffic, no math)";

// The roofline for Adam's access pattern: read p, g, m, v and write p, m, v
// (28 bytes per element) with no math to speak of, over the same threads.
void stream_step(const std::vector<colossus::kernels::AdamTensorPtrs>& table, int threads) {
  auto range = [&](int64_t lo, int64_t hi) {
    for (const auto& t : table) {
      float* __restrict p = t.param;
      const float* __restrict g = t.grad;
      float* __restrict m = t.exp_avg;
      float* __restrict v = t.exp_avg_sq;
      const int64_t a = lo * t.numel / threads, b = hi * t.numel / threads;
#pragma omp simd
      for (int64_t i = a; i < b; ++i) {
        // + 0 * g: the traffic of an update that leaves the Adam state valid
        // (a real += would drive v negative and the next Adam steps to NaN).
        const float zero_g = 0.0f * g[i];
        p[i] += zero_g;
        m[i] += zero_g;
        v[i] += zero_g;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) pool.emplace_back(range, k, k + 1);
  range(0, 1);
  for (auto& th : pool) th.join();
}

std::vector<int64_t> split(int64_t numel, int64_t parts) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < parts; ++i) sizes.push_back(numel / parts + (i < numel % parts ? 1 : 0));
  return sizes;
}

// memcpy over `threads` threads of a 1 GiB buffer; bytes read + written per second.
double memcpy_gb_per_s(int threads) {
  const size_t bytes = size_t{1} << 30;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double ms = median_ms(1, 5, [&] {
    std::vector<std::thread> pool;
    const size_t chunk = bytes / static_cast<size_t>(threads);
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] { std::memcpy(dst.data() + t * chunk, src.data() + t * chunk, chunk); });
    }
    for (auto& th : pool) th.join();
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

struct Row {
  std::string impl;
  double ms;
  std::string label = {};  // column header when this row is a peer
};

}  // namespace

int main(int argc, char** argv) try {
  const Config cfg = parse(argc, argv);
  at::set_num_threads(cfg.threads);
  const auto sizes = split(cfg.numel, cfg.tensors);
  const double bytes_per_step = 28.0 * static_cast<double>(cfg.numel);
  const std::string config = fmt::format("{}M fp32 params in {} tensors, {} threads, AdamW lr=1e-3 betas=(0.9,0.95) "
                                         "wd=0.1, median over {} rounds of the median of {} steps after {} warm-up",
                                         cfg.numel / 1e6, cfg.tensors, cfg.threads, cfg.rounds, cfg.steps, cfg.warmup);
  fmt::print("{}\n", config);

  std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  for (int64_t n : sizes) {
    params.push_back(at::randn({n}, gen));
    grads.push_back(at::randn({n}, gen) * 1e-2);
    exp_avg.push_back(at::zeros({n}));
    exp_avg_sq.push_back(at::zeros({n}));
  }
  std::vector<colossus::kernels::AdamTensorPtrs> table;
  for (size_t i = 0; i < sizes.size(); ++i) {
    table.push_back({params[i].data_ptr<float>(), grads[i].data_ptr<float>(), exp_avg[i].data_ptr<float>(),
                     exp_avg_sq[i].data_ptr<float>(), sizes[i]});
  }
  // Rounds alternate ours, the stream roofline and torch, so that load from
  // other work on the machine hits all of them alike; each figure is the
  // median over rounds of the per-round median step.
  std::map<std::string, std::vector<double>> samples;
  std::vector<std::string> our_names, peer_names;
  std::string torch_version = "?";
  const fs::path repo = bench::repo_root();
  for (int round = 0; round < cfg.rounds; ++round) {
    for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
      if (!colossus::kernels::cpu_supports(isa)) continue;
      int64_t step = 0;
      const double ms = median_ms(cfg.warmup, cfg.steps, [&] {
        const auto h = colossus::kernels::make_adam_hyper(1e-3, 0.9, 0.95, 1e-8, 0.1, true, true, ++step);
        colossus::kernels::adam_step_cpu(table.data(), static_cast<int64_t>(table.size()), h, cfg.threads, isa);
      });
      const std::string name = "colossus HybridAdam kernel (" + colossus::kernels::isa_name(isa) + ")";
      if (round == 0) our_names.push_back(name);
      samples[name].push_back(ms);
    }
    samples[kStream].push_back(median_ms(cfg.warmup, cfg.steps, [&] { stream_step(table, cfg.threads); }));
    if (cfg.python) {
      const std::string out = bench::run_command(fmt::format("'{}' '{}' {} {} {} {} {}",
                                                             (repo / ".venv/bin/python").string(),
                                                             (repo / "bench/bench_cpu_adam.py").string(), cfg.numel,
                                                             cfg.tensors, cfg.steps, cfg.warmup, cfg.threads));
      try {
        const auto j = nlohmann::json::parse(out.substr(out.rfind('{')));
        samples["torch.optim.AdamW(foreach=True)"].push_back(j.at("foreach").get<double>());
        samples["torch.optim.AdamW(fused=True)"].push_back(j.at("fused").get<double>());
        torch_version = j.at("torch").get<std::string>();
      } catch (const std::exception& e) {
        fmt::print(stderr, "bench_cpu_adam.py gave no result ({}):\n{}\n", e.what(), out);
        return 1;
      }
    }
    fmt::print("  round {}:", round + 1);
    for (const auto& [name, v] : samples) fmt::print(" [{}] {:.1f} ms", name, v.back());
    fmt::print("\n");
  }
  exp_avg.clear();
  exp_avg_sq.clear();
  params.clear();
  grads.clear();
  std::vector<Row> ours, peers;
  for (const auto& name : our_names) ours.push_back({name, median(samples[name])});
  if (cfg.python) {
    peers.push_back({"torch.optim.AdamW(foreach=True)", median(samples["torch.optim.AdamW(foreach=True)"]), "x vs foreach"});
    peers.push_back({"torch.optim.AdamW(fused=True)", median(samples["torch.optim.AdamW(fused=True)"]), "x vs fused"});
  }
  const double stream_ms = median(samples[kStream]);
  const double bandwidth = memcpy_gb_per_s(cfg.threads);
  const double roofline_ms = bytes_per_step / (bandwidth * 1e9) * 1e3;

  // The table.
  std::string header = fmt::format("| {:<44} | {:>9} | {:>12} |", "impl", "ms/step", "GB/s (28 B)");
  std::string rule = fmt::format("|{:-<46}|{:->11}|{:->14}|", "", "", "");
  for (const auto& p : peers) {
    header += fmt::format(" {:>14} |", p.label);
    rule += fmt::format("{:->16}|", "");
  }
  std::vector<std::string> lines = {header, rule};
  auto line = [&](const Row& r) {
    std::string s = fmt::format("| {:<44} | {:9.1f} | {:12.2f} |", r.impl, r.ms, bytes_per_step / (r.ms * 1e-3) / 1e9);
    for (const auto& p : peers) s += fmt::format(" {:14.2f} |", p.ms / r.ms);
    return s;
  };
  for (const auto& r : ours) lines.push_back(line(r));
  for (const auto& r : peers) lines.push_back(line(r));
  lines.push_back(line({"roofline: same 28 B/param traffic, no math", stream_ms}));
  lines.push_back(line({fmt::format("roofline: 28 B/param at memcpy {:.1f} GB/s", bandwidth), roofline_ms}));
  fmt::print("\n");
  for (const auto& l : lines) fmt::print("{}\n", l);
  fmt::print("(columns 'x vs PEER': PEER's ms / this row's ms, so > 1 is faster than PEER; peers in order: ");
  for (const auto& p : peers) fmt::print("{}; ", p.impl);
  fmt::print(")\n");

  if (!cfg.record) return 0;
  // Not bench::commit_or: this git call's stderr is not silenced.
  const std::string commit = bench::run_command(fmt::format("git -C '{}' rev-parse --short HEAD", repo.string()));
  std::string model = bench::run_command("lscpu | sed -n 's/^Model name: *//p' | head -1");
  const std::string machine = fmt::format("{}, {} cores", model.empty() ? "unknown CPU" : model,
                                          std::thread::hardware_concurrency());
  const std::string date = bench::today(bench::kDateTimeUtc);
  {
    std::ofstream md(repo / "bench/RESULTS.md", std::ios::app);
    md << fmt::format("\n## cpu_adam — {}\n\nmachine: {}; commit {}; torch {}\ncommand: `{}`\nconfig: {}\n\n", date,
                      machine, commit, torch_version, cfg.command, config);
    for (const auto& l : lines) md << l << "\n";
    md << fmt::format("\n'x vs' columns, in order: {}. A fused step moves 28 bytes per parameter; the roofline row "
                      "is that traffic at measured memcpy bandwidth (read + write).\n",
                      [&] {
                        std::string s;
                        for (const auto& p : peers) s += (s.empty() ? "" : ", ") + p.impl;
                        return s;
                      }());
  }
  std::ofstream jsonl(repo / "bench/results.jsonl", std::ios::app);
  auto emit = [&](const Row& r, const std::string& peer, double peer_ms) {
    jsonl << nlohmann::json{{"date", date},          {"commit", commit},     {"machine", machine},
                            {"bench", "cpu_adam"},   {"config", config},     {"metric", "ms_per_step"},
                            {"value", r.ms},         {"impl", r.impl},       {"peer", peer},
                            {"peer_value", peer_ms}, {"ratio", peer_ms / r.ms}}
                 .dump()
          << "\n";
  };
  for (const auto& r : ours) {
    for (const auto& p : peers) emit(r, p.impl, p.ms);
    emit(r, "roofline: stream of the same 28 B/param traffic", stream_ms);
    emit(r, "roofline: 28 B/param at memcpy bandwidth", roofline_ms);
  }
  fmt::print("appended to {} and {}\n", (repo / "bench/RESULTS.md").string(), (repo / "bench/results.jsonl").string());
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_cpu_adam: {}\n", e.what());
  return 1;
}
