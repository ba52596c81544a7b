// The decode GEMV (kernels/gemv.h, each epilogue) against the GEMM library's path (at::linear = cuBLAS, plus the
// separate SwiGLU / residual kernel the unfused layer runs) on the shapes of a
// llama-1b-like decode step (hidden 2048, SwiGLU 8192, GQA 32/8 of 64, vocab
// 32000), at 1, 2, 4 and 8 rows (sequences), bf16. Each variant is captured
// 50 times back to back in a CUDA graph and replayed, so the time per call is
// device time with the launch gaps a decode graph has. GB/s counts the weight
// bytes once (the calls cycle through copies of W that overflow the L2
// cache, as a decode step streams its weights from HBM); the ratio is against
// the device-to-device copy bandwidth measured in the same run. Also checks each output against at::linear.
// Prints a table; appends to bench/RESULTS.md and bench/results.jsonl.
// Usage: bench_gemv [--iters 20] [--no-record] [--commit SHA] [--out-dir DIR]
#include "bench/bench_common.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace bench = colossus::bench;
namespace kernels = colossus::kernels;
using Clock = std::chrono::steady_clock;

void sync() { at::accelerator::synchronizeDevice(0); }

// Mean device seconds per call of `body`, captured kCalls times in one graph.
double graph_seconds(const std::function<void()>& body, int iters) {
  constexpr int kCalls = 50;
  auto graph = colossus::kernels::cuda_slots().make_device_graph(0);
  graph->run_on_capture_stream(body);
  graph->capture([&] {
    for (int i = 0; i < kCalls; ++i) body();
  });
  for (int i = 0; i < 3; ++i) graph->replay();
  sync();
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) graph->replay();
  sync();
  return std::chrono::duration<double>(Clock::now() - start).count() / (iters * kCalls);
}

double copy_bandwidth() {
  at::Tensor src = at::ones({int64_t{1} << 30}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  at::Tensor dst = at::empty_like(src);
  return 2.0 * static_cast<double>(src.numel()) / graph_seconds([&] { dst.copy_(src); }, 5);
}

}  // namespace

int main(int argc, char** argv) try {
  int iters = 20;
  bool record = true;
  std::string commit, out_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
    else if (a == "--no-record") record = false;
    else if (a == "--commit" && i + 1 < argc) commit = argv[++i];
    else if (a == "--out-dir" && i + 1 < argc) out_dir = argv[++i];
    else throw std::runtime_error("usage: bench_gemv [--iters N] [--no-record] [--commit SHA] [--out-dir DIR]");
  }
  if (!at::hasCUDA() || colossus::kernels::cuda_slots().gemv == nullptr) {
    throw std::runtime_error("bench_gemv needs a CUDA device and a CUDA build");
  }
  at::NoGradGuard no_grad;
  const double bandwidth = copy_bandwidth();
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  struct Shape {
    const char* name;
    int64_t out, in;
    const char* epilogue;  // "none", "residual", "gated"
  };
  const std::vector<Shape> shapes = {{"qkv", 3072, 2048, "none"},
                                     {"o_proj + residual", 2048, 2048, "residual"},
                                     {"gate_up + SwiGLU", 16384, 2048, "gated"},
                                     {"down + residual", 2048, 8192, "residual"},
                                     {"lm_head", 32000, 2048, "none"}};
  std::vector<std::string> lines = {
      "| matrix (out x in) | rows | K split | GEMV us | cuBLAS path us | GEMV / cuBLAS speed | GEMV GB/s | % of copy BW | max rel err |",
      "|---|---|---|---|---|---|---|---|---|"};
  std::string jsonl;
  const std::string date = bench::today(bench::kDateTimeUtc), machine = bench::machine_name(true);
  const std::string sha = bench::commit_or(commit, bench::repo_root(), "unknown (pass --commit)");
  for (const Shape& s : shapes) {
    // Enough copies of W to overflow the L2 cache twice over (a decode step
    // reads each weight once, from HBM); calls cycle through them.
    const int64_t copies = std::max<int64_t>(2, (int64_t{256} << 20) / (s.out * s.in * 2) + 1);
    std::vector<at::Tensor> weights;
    for (int64_t i = 0; i < copies; ++i) weights.push_back(at::randn({s.out, s.in}, bf16) * 0.02);
    size_t next = 0;
    const at::Tensor& w0 = weights[0];
    const std::string epi = s.epilogue;
    const int64_t width = epi == "gated" ? s.out / 2 : s.out;
    for (int64_t rows : {1, 2, 4, 8}) {
      const at::Tensor x = at::randn({rows, s.in}, bf16);
      at::Tensor residual = at::randn({rows, width}, bf16), scratch = residual.clone();
      // Each call takes the next copy of W (in a graph: the capture's order).
      // The kernel itself (the models layer calls it for 1-2 rows only).
      at::Tensor out = at::empty({rows, width}, bf16);
      const auto ours = [&](const at::Tensor& w) -> at::Tensor {
        kernels::GemvArgs args{.epilogue = epi == "gated"      ? kernels::GemvEpilogue::kGated
                                           : epi == "residual" ? kernels::GemvEpilogue::kResidual
                                                               : kernels::GemvEpilogue::kNone,
                               .rows = rows, .in_features = s.in, .out_features = s.out, .x = x.data_ptr(),
                               .weight = w.data_ptr()};
        args.residual = epi == "residual" ? scratch.data_ptr() : nullptr;
        args.y = epi == "residual" ? scratch.data_ptr() : out.data_ptr();
        if (!kernels::cuda_slots().gemv(args, 0)) {
          throw std::runtime_error(fmt::format("{} rows {}: the GEMV did not take the arguments", s.name, rows));
        }
        return epi == "residual" ? scratch : out;
      };
      const auto theirs = [&](const at::Tensor& w) -> at::Tensor {
        at::Tensor y = at::linear(x, w);
        if (epi == "gated") y = at::silu(y.narrow(1, 0, width)) * y.narrow(1, width, width);
        if (epi == "residual") y = scratch.add_(y);
        return y;
      };
      const auto cycle = [&](const std::function<at::Tensor(const at::Tensor&)>& f) {
        return [&, f] { f(weights[next++ % weights.size()]); };
      };
      // Correctness first (fresh residuals), then time.
      scratch.copy_(residual);
      const at::Tensor got = ours(w0).clone();
      scratch.copy_(residual);
      const at::Tensor want = theirs(w0).to(at::kDouble);
      const double err = ((got.to(at::kDouble) - want).abs().max() / want.abs().max().clamp_min(1e-30)).item<double>();
      const double t_ours = graph_seconds(cycle(ours), iters);
      const double t_theirs = graph_seconds(cycle(theirs), iters);
      const double bytes = static_cast<double>(s.out * s.in * 2);
      const int32_t split = kernels::gemv_k_split({.epilogue = epi == "gated" ? kernels::GemvEpilogue::kGated
                                                                              : kernels::GemvEpilogue::kNone,
                                                   .rows = rows, .in_features = s.in, .out_features = s.out});
      lines.push_back(fmt::format("| {} ({} x {}) | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.0f} | {:.0f}% | {:.1e} |",
                                  s.name, s.out, s.in, rows, split, t_ours * 1e6, t_theirs * 1e6, t_theirs / t_ours,
                                  bytes / t_ours / 1e9, 100.0 * bytes / t_ours / bandwidth, err));
      jsonl += nlohmann::json{{"date", date}, {"commit", sha}, {"machine", machine}, {"bench", "gemv"},
                              {"config", fmt::format("{} ({} x {}), {} rows, bf16, CUDA graph of 50 calls", s.name, s.out,
                                                     s.in, rows)},
                              {"metric", "call_us"}, {"value", t_ours * 1e6}, {"peer", "at::linear (cuBLAS) + epilogue"},
                              {"peer_value", t_theirs * 1e6}, {"ratio", t_theirs / t_ours}}
                   .dump() +
               "\n";
      fmt::print("{}\n", lines.back());
      std::fflush(stdout);
      if (!(err < 2e-2)) throw std::runtime_error(fmt::format("{} rows {}: GEMV differs from at::linear by {:.2e}", s.name, rows, err));
    }
  }
  std::string section = fmt::format(
      "\n## gemv — {}\n\nmachine: {}; commit {}\ncommand: `bench_gemv`\nconfig: llama-1b-like decode shapes, bf16 weights "
      "N(0, 0.02), cycled through copies of >= 256 MiB in all (L2-cold); each variant captured 50 times in one CUDA graph, {} replays; cuBLAS path = at::linear plus the "
      "unfused epilogue (SwiGLU, residual add); device-to-device copy bandwidth {:.0f} GB/s (read + write)\n\n",
      date, machine, sha, iters, bandwidth / 1e9);
  for (const auto& l : lines) section += l + "\n";
  fmt::print("\ncopy bandwidth {:.0f} GB/s\n", bandwidth / 1e9);
  if (!out_dir.empty()) {
    fs::create_directories(out_dir);
    bench::append_file(fs::path(out_dir) / "gemv_RESULTS.md", section);
    bench::append_file(fs::path(out_dir) / "gemv_results.jsonl", jsonl);
  }
  if (record) {
    bench::append_file(bench::repo_root() / "bench/RESULTS.md", section);
    bench::append_file(bench::repo_root() / "bench/results.jsonl", jsonl);
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_gemv: {}\n", e.what());
  return 1;
}
