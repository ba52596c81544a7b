// The MoE layer (router + dispatch + experts + combine) on one device, forward
// and forward+backward, three ways over the same weights and tokens:
//   colossus grouped: SparseMoeBlock as the models run it (one sort by expert,
//                     the experts as two grouped GEMMs over the packed weights,
//                     one index_add combine);
//   colossus loop:    the same dispatch, one matmul chain per expert
//                     (set_grouped_gemm(false), what a broken packed layout
//                     falls back to);
//   naive loop:       transformers' eager MixtralSparseMoeBlock pattern: per
//                     expert, find its tokens (a nonzero, so a host sync),
//                     gather, run, scale, index_add.
// Beside them, the dense roofline of the run: one SwiGLU matmul chain over all
// routed rows (the same FLOPs with no routing), timed in the same process.
// Outputs of the three are compared (max relative difference printed). On
// CUDA, when the build registers the dispatch kernels (kernels/moe_permute.h),
// "colossus grouped" sorts, permutes and combines with them; the same layer
// with the ATen dispatch ops (set_dispatch_kernels(false)) is timed beside it
// and compared too (its own table and JSONL rows).
// With --peer FILE (what bench/moe_layer_peer.py printed in the same device
// call: transformers' own Qwen3MoeSparseMoeBlock at these shapes, its eager
// loop and its grouped_mm experts), a table and rows against it.
// Prints a table; appends to bench/RESULTS.md and bench/results.jsonl.
//
// Usage: bench_moe_layer [--device cuda|cpu] [--quick] [--iters N] [--peer FILE] [--commit SHA] [--no-record]
#include "bench/bench_common.h"
#include "colossus/models/config.h"
#include "colossus/models/layers.h"
#include "colossus/models/moe_layer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/headeronly/version.h>

#include <chrono>
#include <fstream>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace bench = colossus::bench;
using colossus::models::Linear;
using colossus::models::MixtralConfig;
using colossus::models::SparseMoeBlock;

struct Shape {
  std::string name;
  int64_t hidden, intermediate, experts, top_k, tokens;
};

struct Options {
  std::string device = torch::cuda::is_available() ? "cuda" : "cpu";
  bool quick = false;
  bool record = true;
  int iters = 20;
  std::string commit;
  std::string peer;
  std::string command = "bench_moe_layer";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    o.command += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      o.command += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--device") o.device = next();
    else if (a == "--quick") o.quick = true;
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--commit") o.commit = next();
    else if (a == "--peer") o.peer = next();
    else if (a == "--no-record") o.record = false;
    else if (a == "--help" || a == "-h") {
      fmt::print("usage: bench_moe_layer [--device cuda|cpu] [--quick] [--iters N] [--peer FILE] [--commit SHA] [--no-record]\n");
      std::exit(0);
    } else {
      throw std::runtime_error("unknown flag " + a + " (valid: --device, --quick, --iters, --peer, --commit, --no-record)");
    }
  }
  if (o.device != "cuda" && o.device != "cpu") throw std::runtime_error("--device is " + o.device + "; use cuda or cpu");
  if (o.device == "cuda" && !torch::cuda::is_available()) throw std::runtime_error("--device cuda but no GPU is visible");
  return o;
}

void sync(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

double time_ms(const at::Device& device, int warmup, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  sync(device);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  sync(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iters;
}

// transformers' eager MixtralSparseMoeBlock: a loop over experts, each finding
// its tokens with a nonzero.
at::Tensor naive_moe(SparseMoeBlock& moe, const at::Tensor& hidden) {
  at::Tensor x = hidden.reshape({-1, hidden.size(-1)});
  colossus::models::moe::Routing r = colossus::models::moe::route(moe.layer("gate").forward(x), moe.top_k());
  at::Tensor out = at::zeros_like(x);
  for (int64_t e = 0; e < moe.num_experts(); ++e) {
    std::vector<at::Tensor> where = at::where(r.experts == e);  // (token, slot) pairs routed to e
    if (where[0].numel() == 0) continue;
    at::Tensor y = moe.expert(e).forward(x.index_select(0, where[0]));
    at::Tensor w = r.weights.index({where[0], where[1]}).unsqueeze(1);
    out = out.index_add(0, where[0], (y.to(at::kFloat) * w).to(x.scalar_type()));
  }
  return out.view_as(hidden);
}

struct Timing {
  double fwd_ms = 0, step_ms = 0;
};

Timing time_impl(const at::Device& device, int iters, const at::Tensor& x, const at::Tensor& grad,
                 const std::function<at::Tensor(const at::Tensor&)>& forward) {
  Timing t;
  {
    at::NoGradGuard no_grad;
    t.fwd_ms = time_ms(device, 3, iters, [&] { forward(x); });
  }
  at::Tensor input = x.detach().requires_grad_(true);
  t.step_ms = time_ms(device, 3, iters, [&] { forward(input).backward(grad); });
  return t;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kFloat) - b.to(at::kFloat)).norm() / b.to(at::kFloat).norm().clamp_min(1e-30)).item<double>();
}

// bench/moe_layer_peer.py's key of a shape.
std::string peer_key(const Shape& s) {
  return fmt::format("{}x{}x{}x{}x{}", s.hidden, s.intermediate, s.experts, s.top_k, s.tokens);
}

struct Row {
  Shape shape;
  Timing grouped, loop, naive, dense;
  Timing aten_dispatch;  // CUDA with the dispatch kernels only
  bool dispatch_kernels = false;
  double flops_fwd = 0;
  double diff_loop = 0, diff_naive = 0, diff_dispatch = 0;
  int64_t max_rows = 0, min_rows = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  const at::Device device(opt.device);
  const at::ScalarType dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  std::vector<Shape> shapes;
  if (opt.quick) {
    shapes = {{"tiny (8 experts, top-2)", 64, 128, 8, 2, 256}, {"tiny fine-grained (32 experts, top-4)", 64, 32, 32, 4, 256}};
  } else {
    shapes = {{"mixtral-8x7b layer (8 experts, top-2)", 4096, 14336, 8, 2, 8192},
              {"fine-grained (64 experts, top-6)", 2048, 1408, 64, 6, 8192},
              {"fine-grained (128 experts, top-8)", 2048, 768, 128, 8, 8192}};
  }
  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    MixtralConfig c = std::get<MixtralConfig>(colossus::models::preset("mixtral-tiny"));
    c.hidden_size = s.hidden;
    c.intermediate_size = s.intermediate;
    c.num_local_experts = s.experts;
    c.num_experts_per_tok = s.top_k;
    at::manual_seed(0);
    SparseMoeBlock moe(c, options);
    {
      at::NoGradGuard no_grad;
      for (auto& p : moe.parameters()) p.normal_(0.0, 0.02);
      moe.pack_experts();  // normal_ wrote in place: the layout is intact, this only re-asserts it
    }
    if (!moe.grouped_gemm_ready()) throw std::runtime_error("the packed expert layout is not usable for " + s.name);
    at::Tensor x = at::randn({1, s.tokens, s.hidden}, options);
    at::Tensor grad = at::randn({1, s.tokens, s.hidden}, options) * 1e-2;
    Row row{.shape = s};
    row.flops_fwd = 2.0 * 3.0 * static_cast<double>(s.tokens * s.top_k) * static_cast<double>(s.hidden) *
                    static_cast<double>(s.intermediate);
    {
      at::NoGradGuard no_grad;
      at::Tensor counts = at::bincount(
          std::get<1>(at::topk(moe.layer("gate").forward(x.view({-1, s.hidden})), s.top_k, -1)).reshape(-1), {},
          s.experts);
      row.max_rows = counts.max().item<int64_t>();
      row.min_rows = counts.min().item<int64_t>();
      at::Tensor grouped = moe.forward(x);
      moe.set_grouped_gemm(false);
      at::Tensor looped = moe.forward(x);
      moe.set_grouped_gemm(true);
      at::Tensor naive = naive_moe(moe, x);
      row.diff_loop = rel_diff(grouped, looped);
      row.diff_naive = rel_diff(grouped, naive);
      row.dispatch_kernels = colossus::models::moe::dispatch_kernels_available(x);
      if (row.dispatch_kernels) {
        moe.set_dispatch_kernels(false);
        row.diff_dispatch = rel_diff(grouped, moe.forward(x));
        moe.set_dispatch_kernels(true);
      }
    }
    row.grouped = time_impl(device, opt.iters, x, grad, [&](const at::Tensor& in) { return moe.forward(in); });
    moe.set_grouped_gemm(false);
    row.loop = time_impl(device, opt.iters, x, grad, [&](const at::Tensor& in) { return moe.forward(in); });
    moe.set_grouped_gemm(true);
    if (row.dispatch_kernels) {
      moe.set_dispatch_kernels(false);
      row.aten_dispatch = time_impl(device, opt.iters, x, grad, [&](const at::Tensor& in) { return moe.forward(in); });
      moe.set_dispatch_kernels(true);
    }
    row.naive = time_impl(device, opt.iters, x, grad, [&](const at::Tensor& in) { return naive_moe(moe, in); });
    // Dense roofline: the same rows through one expert-sized SwiGLU chain, no routing.
    Linear w13(s.hidden, 2 * s.intermediate, false, options), w2(s.intermediate, s.hidden, false, options);
    {
      at::NoGradGuard no_grad;
      w13.weight.normal_(0.0, 0.02);
      w2.weight.normal_(0.0, 0.02);
    }
    at::Tensor routed = at::randn({s.tokens * s.top_k, s.hidden}, options);
    at::Tensor routed_grad = at::randn({s.tokens * s.top_k, s.hidden}, options) * 1e-2;
    row.dense = time_impl(device, opt.iters, routed, routed_grad, [&](const at::Tensor& in) {
      at::Tensor h = w13.forward(in);
      return w2.forward(at::silu(h.narrow(1, 0, s.intermediate)) * h.narrow(1, s.intermediate, s.intermediate));
    });
    rows.push_back(row);
    fmt::print("{}: grouped fwd {:.3f} ms, loop {:.3f}, naive {:.3f}, dense {:.3f}\n", s.name, row.grouped.fwd_ms,
               row.loop.fwd_ms, row.naive.fwd_ms, row.dense.fwd_ms);
  }

  const std::string machine = bench::machine_name(device.is_cuda());
  std::vector<std::string> lines = {
      "| layer | tokens | rows/expert min-max | pass | colossus grouped ms | TFLOP/s | colossus loop ms | naive loop ms | "
      "x vs naive | dense roofline ms | of roofline | rel diff loop / naive |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"};
  for (const Row& r : rows) {
    for (const bool step : {false, true}) {
      const double ours = step ? r.grouped.step_ms : r.grouped.fwd_ms;
      const double loop = step ? r.loop.step_ms : r.loop.fwd_ms;
      const double naive = step ? r.naive.step_ms : r.naive.fwd_ms;
      const double dense = step ? r.dense.step_ms : r.dense.fwd_ms;
      const double flops = r.flops_fwd * (step ? 3.0 : 1.0);
      lines.push_back(fmt::format("| {} | {} | {}-{} | {} | {:.3f} | {:.0f} | {:.3f} | {:.3f} | {:.2f} | {:.3f} | "
                                  "{:.2f} | {:.1e} / {:.1e} |",
                                  r.shape.name, r.shape.tokens, r.min_rows, r.max_rows, step ? "fwd+bwd" : "fwd", ours,
                                  flops / (ours * 1e-3) / 1e12, loop, naive, naive / ours, dense, dense / ours,
                                  r.diff_loop, r.diff_naive));
    }
  }
  // Dispatch kernels (sort + permute + combine) against the ATen ops, same layer.
  if (!rows.empty() && rows.front().dispatch_kernels) {
    lines.push_back("");
    lines.push_back("| layer | pass | dispatch kernels ms | ATen dispatch ms | speedup | rel diff |");
    lines.push_back("|---|---|---|---|---|---|");
    for (const Row& r : rows) {
      for (const bool step : {false, true}) {
        const double ours = step ? r.grouped.step_ms : r.grouped.fwd_ms;
        const double aten = step ? r.aten_dispatch.step_ms : r.aten_dispatch.fwd_ms;
        lines.push_back(fmt::format("| {} | {} | {:.3f} | {:.3f} | {:.2f} | {:.1e} |", r.shape.name,
                                    step ? "fwd+bwd" : "fwd", ours, aten, aten / ours, r.diff_dispatch));
      }
    }
  }
  // transformers' own block at the same shapes, measured in the same device call.
  nlohmann::json peer;
  if (!opt.peer.empty()) {
    std::ifstream in(opt.peer);
    if (!in) throw std::runtime_error("--peer " + opt.peer + ": cannot open it");
    peer = nlohmann::json::parse(in);
    lines.push_back("");
    lines.push_back("| layer | pass | colossus ms | transformers eager ms | x | transformers grouped_mm ms | x |");
    lines.push_back("|---|---|---|---|---|---|---|");
    for (const Row& r : rows) {
      const nlohmann::json& p = peer.value(peer_key(r.shape), nlohmann::json::object());
      for (const bool step : {false, true}) {
        const double ours = step ? r.grouped.step_ms : r.grouped.fwd_ms;
        std::string cells;
        for (const char* impl : {"eager", "grouped_mm"}) {
          if (!p.contains(impl)) {
            cells += " n/a | - |";
            continue;
          }
          const double theirs = p[impl].at(step ? "step_ms" : "fwd_ms").get<double>();
          cells += fmt::format(" {:.3f} | {:.2f} |", theirs, theirs / ours);
        }
        lines.push_back(fmt::format("| {} | {} | {:.3f} |{}", r.shape.name, step ? "fwd+bwd" : "fwd", ours, cells));
      }
    }
  }
  fmt::print("\nMoE layer on {} ({}):\n", machine, dtype == at::kBFloat16 ? "bf16" : "fp32");
  for (const auto& l : lines) fmt::print("{}\n", l);
  for (const Row& r : rows) {
    // bf16 sums in different orders: a few 1e-3 relative is expected; anything larger is a bug.
    if (r.diff_loop > 2e-2 || r.diff_naive > 2e-2 || r.diff_dispatch > 2e-2) {
      fmt::print(stderr, "bench_moe_layer: {}: outputs disagree (rel diff loop {:.2e}, naive {:.2e}, ATen dispatch {:.2e})\n",
                 r.shape.name, r.diff_loop, r.diff_naive, r.diff_dispatch);
      return 1;
    }
  }
  if (!opt.record) return 0;

  const fs::path repo = bench::repo_root();
  const std::string commit = bench::commit_or(opt.commit, repo, "unknown (pass --commit)");
  const std::string date = bench::today(bench::kDateTimeUtc);
  const std::string config = fmt::format(
      "{}, random tokens and gate (seed 0), weights N(0, 0.02); mean of {} calls after 3 warm-up, wall clock around a "
      "device sync; fwd under no_grad, fwd+bwd = forward + backward of a fixed output gradient; TFLOP/s count the "
      "expert matmuls only (6 * rows * hidden * intermediate per pass, x3 for fwd+bwd); dense roofline = the same "
      "rows through one SwiGLU chain of the expert's size (no routing), same run",
      dtype == at::kBFloat16 ? "bf16" : "fp32", opt.iters);
  std::string section = fmt::format("\n## moe_layer — {}\n\nmachine: {}; commit {}; torch {}\ncommand: `{}`\nconfig: {}\n\n",
                                    date, machine, commit, TORCH_VERSION, opt.command, config);
  for (const auto& l : lines) section += l + "\n";
  std::string jsonl;
  for (const Row& r : rows) {
    for (const bool step : {false, true}) {
      const double ours = step ? r.grouped.step_ms : r.grouped.fwd_ms;
      auto emit = [&](const std::string& peer, double peer_ms) {
        jsonl += nlohmann::json{{"date", date},
                                {"commit", commit},
                                {"machine", machine},
                                {"bench", "moe_layer"},
                                {"config", fmt::format("{}, {} tokens, {}", r.shape.name, r.shape.tokens,
                                                       step ? "fwd+bwd" : "fwd")},
                                {"metric", "ms_per_call"},
                                {"value", ours},
                                {"impl", r.dispatch_kernels
                                             ? "colossus SparseMoeBlock (dispatch kernels, grouped GEMM)"
                                             : "colossus SparseMoeBlock (sorted dispatch, grouped GEMM)"},
                                {"peer", peer},
                                {"peer_value", peer_ms},
                                {"ratio", peer_ms / ours}}
                     .dump() +
                 "\n";
      };
      emit("naive per-expert loop (transformers eager pattern)", step ? r.naive.step_ms : r.naive.fwd_ms);
      emit("colossus sorted dispatch, one matmul chain per expert", step ? r.loop.step_ms : r.loop.fwd_ms);
      emit("dense roofline: same rows through one SwiGLU chain", step ? r.dense.step_ms : r.dense.fwd_ms);
      if (r.dispatch_kernels) {
        emit("colossus grouped GEMM with the ATen dispatch ops (no dispatch kernels)",
             step ? r.aten_dispatch.step_ms : r.aten_dispatch.fwd_ms);
      }
      const nlohmann::json& p = peer.is_object() ? peer.value(peer_key(r.shape), nlohmann::json::object())
                                                 : nlohmann::json::object();
      for (const char* impl : {"eager", "grouped_mm"}) {
        if (p.contains(impl)) {
          emit(fmt::format("transformers Qwen3MoeSparseMoeBlock ({} experts)", impl),
               p[impl].at(step ? "step_ms" : "fwd_ms").get<double>());
        }
      }
    }
  }
  bench::append_file(repo / "bench/RESULTS.md", section);
  bench::append_file(repo / "bench/results.jsonl", jsonl);
  fmt::print("\nappended to {} and {}\n", (repo / "bench/RESULTS.md").string(), (repo / "bench/results.jsonl").string());
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_moe_layer: {}\n", e.what());
  return 1;
}
