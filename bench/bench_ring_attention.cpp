// Ring attention's kernel path on ONE device against SDPA full attention.
// ring_attn runs, per ring step, blockwise attention of this rank's queries
// against one key/value block, merged into the running output by the
// online softmax (colossus/parallel/sequence/ring_attention.h). Here sp ranks
// are simulated on one process: the sequence is cut into sp zig-zag shards
// and every shard's queries attend block by block in ring order
// (blockwise_ring_attention, the same blocks and arithmetic the ring runs,
// without communication). The peer is at::scaled_dot_product_attention on the
// same inputs (flash attention for bf16 on CUDA), causal. Forward alone and
// forward + backward are timed; outputs (and gradients) are compared.
// Prints a table; on CUDA appends to bench/RESULTS.md and bench/results.jsonl
// (and, with --out-dir, writes the same section and rows there too).
//
// Usage: bench_ring_attention [--device cuda|cpu] [--quick] [--batches 1,4]
// [--heads 16,32]
//                             [--seqs 2048,8192,32768] [--head-dim 128]
//                             [--sp 2,4,8 (default: T/2048 in [2, 16])]
//                             [--kernels fused,math] [--iters N]
//                             [--out-dir DIR] [--commit SHA] [--no-record]
// --kernels picks ring attention's block kernel (RingAttentionOptions::
// block_kernel): fused (the SDPA kernel that returns the log-sum-exp: cuDNN's
// where it takes the block, else flash's; the default) and/or math (block
// matmuls, the path before it), compared in one run.
#include "bench/bench_common.h"
#include "colossus/parallel/sequence/ring_attention.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/headeronly/version.h>
#ifdef BENCH_RING_ATTENTION_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace bench = colossus::bench;
namespace ps = colossus::parallel::sequence;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string device; // empty: cuda if available, else cpu
  std::vector<int64_t> batches = {1, 4};
  std::vector<int64_t> heads = {16, 32};
  std::vector<int64_t> seqs = {2048, 8192, 32768};
  int64_t head_dim = 128;
  // Empty: T / 2048 clamped to [2, 16], so a block is at most 2048 x 2048.
  std::vector<int64_t> sps;
  std::vector<std::string> kernels = {"fused"};
  int iters = 5;
  int warmup = 1;
  bool record = true;
  std::string out_dir, commit;
  std::string command = "bench_ring_attention";
};

std::vector<int64_t> parse_list(const std::string &s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    out.push_back(std::stoll(item));
  return out;
}

Config parse(int argc, char **argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    c.command += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc)
        throw std::runtime_error(a + " needs a value");
      c.command += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--device")
      c.device = next();
    else if (a == "--quick") {
      // A few seconds on a CPU: checks that the bench builds and runs.
      c.batches = {1};
      c.heads = {4};
      c.seqs = {256, 512};
      c.head_dim = 32;
      c.iters = 2;
      c.warmup = 1;
    } else if (a == "--batches")
      c.batches = parse_list(next());
    else if (a == "--heads")
      c.heads = parse_list(next());
    else if (a == "--seqs")
      c.seqs = parse_list(next());
    else if (a == "--head-dim")
      c.head_dim = std::stoll(next());
    else if (a == "--sp")
      c.sps = parse_list(next());
    else if (a == "--kernels") {
      c.kernels.clear();
      std::stringstream in(next());
      std::string item;
      while (std::getline(in, item, ',')) {
        if (item != "fused" && item != "math")
          throw std::runtime_error("--kernels: '" + item +
                                   "' is not fused or math");
        c.kernels.push_back(item);
      }
    }
    else if (a == "--iters")
      c.iters = std::stoi(next());
    else if (a == "--warmup")
      c.warmup = std::stoi(next());
    else if (a == "--out-dir")
      c.out_dir = next();
    else if (a == "--commit")
      c.commit = next();
    else if (a == "--no-record")
      c.record = false;
    else
      throw std::runtime_error("unknown flag " + a);
  }
  return c;
}

void sync(const c10::Device &device) {
  if (device.is_cuda())
    at::accelerator::synchronizeDevice(device.index());
}

// Mean wall milliseconds per call of `fn` (device synchronised around).
double time_ms(const c10::Device &device, int warmup, int iters,
               const std::function<void()> &fn) {
  for (int i = 0; i < warmup; ++i)
    fn();
  sync(device);
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i)
    fn();
  sync(device);
  return std::chrono::duration<double, std::milli>(Clock::now() - start)
             .count() /
         iters;
}

// max |a - b| / max |b|, in float.
double rel_err(const at::Tensor &a, const at::Tensor &b) {
  const at::Tensor bf = b.to(at::kFloat);
  return (a.to(at::kFloat) - bf).abs().max().item<double>() /
         std::max(bf.abs().max().item<double>(), 1e-30);
}

struct Row {
  int64_t batch, heads, seq, sp;
  std::string kernel;
  std::string status; // "ok" or why a config was skipped (out of memory)
  double ring_fwd_ms = 0, sdpa_fwd_ms = 0, ring_train_ms = 0, sdpa_train_ms = 0;
  double out_err = 0, grad_err = 0;
};

Row measure(const Config &cfg, const c10::Device &device, at::ScalarType dtype,
            int64_t b, int64_t h, int64_t t, int64_t sp,
            const std::string &kernel) {
  Row r{b, h, t, sp, kernel, "ok"};
  if (t % (2 * sp) != 0) {
    r.status = fmt::format("T not a multiple of 2*sp = {}", 2 * sp);
    return r;
  }
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  const double scale = 1.0 / std::sqrt(static_cast<double>(cfg.head_dim));
  at::manual_seed(0);
  at::Tensor q = at::randn({b, h, t, cfg.head_dim}, opts),
             k = at::randn({b, h, t, cfg.head_dim}, opts),
             v = at::randn({b, h, t, cfg.head_dim}, opts),
             dout = at::randn({b, h, t, cfg.head_dim}, opts);
  const ps::RingAttentionOptions ring_options{
      .causal = true,
      .scale = scale,
      .layout = ps::SequenceLayout::ZigZag,
      .block_kernel = kernel == "math" ? ps::BlockKernel::Math
                                       : ps::BlockKernel::Fused};
  auto ring = [&](const at::Tensor &q_, const at::Tensor &k_,
                  const at::Tensor &v_) {
    return ps::blockwise_ring_attention(q_, k_, v_, sp, ring_options);
  };
  auto sdpa = [&](const at::Tensor &q_, const at::Tensor &k_,
                  const at::Tensor &v_) {
    return at::scaled_dot_product_attention(q_, k_, v_, {}, 0.0,
                                            /*is_causal=*/true, scale);
  };
  try {
    at::Tensor ring_out, sdpa_out;
    {
      at::NoGradGuard no_grad;
      r.sdpa_fwd_ms = time_ms(device, cfg.warmup, cfg.iters,
                              [&] { sdpa_out = sdpa(q, k, v); });
      r.ring_fwd_ms = time_ms(device, cfg.warmup, cfg.iters,
                              [&] { ring_out = ring(q, k, v); });
      r.out_err = rel_err(ring_out, sdpa_out);
    }
    ring_out = sdpa_out = at::Tensor();
    std::vector<at::Tensor> grads[2];
    auto train = [&](bool use_ring) {
      at::Tensor qg = q.detach().requires_grad_(true),
                 kg = k.detach().requires_grad_(true),
                 vg = v.detach().requires_grad_(true);
      (use_ring ? ring(qg, kg, vg) : sdpa(qg, kg, vg)).backward(dout);
      grads[use_ring ? 1 : 0] = {qg.grad(), kg.grad(), vg.grad()};
    };
    r.sdpa_train_ms =
        time_ms(device, cfg.warmup, cfg.iters, [&] { train(false); });
    r.ring_train_ms =
        time_ms(device, cfg.warmup, cfg.iters, [&] { train(true); });
    for (int i = 0; i < 3; ++i)
      r.grad_err = std::max(r.grad_err, rel_err(grads[1][i], grads[0][i]));
  } catch (const c10::OutOfMemoryError &) {
    r.status = "out of memory";
  }
  if (device.is_cuda())
    at::accelerator::emptyCache();
  return r;
}

} // namespace

int main(int argc, char **argv) try {
  Config cfg = parse(argc, argv);
  if (cfg.device.empty())
    cfg.device = at::hasCUDA() ? "cuda" : "cpu";
  c10::Device device(cfg.device);
  // "cuda" names no index; the synchronisation and properties need one.
  if (device.is_cuda() && !device.has_index())
    device.set_index(0);
  if (device.is_cuda() && !at::hasCUDA())
    throw std::runtime_error("no CUDA device (use --device cpu --quick)");
  // bf16 where SDPA runs flash attention; the CPU runs fp32.
  const at::ScalarType dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  const std::string dtype_name = device.is_cuda() ? "bf16" : "fp32";

  std::string machine = bench::machine_name(false);
#ifdef BENCH_RING_ATTENTION_CUDA
  if (device.is_cuda()) {
    const auto *prop = at::cuda::getCurrentDeviceProperties();
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    machine = fmt::format(
        "1x {} ({} SMs, {:.0f} GiB), driver CUDA {}.{}, runtime {}.{}",
        prop->name, prop->multiProcessorCount,
        static_cast<double>(prop->totalGlobalMem) / (1 << 30), driver / 1000,
        driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  }
#endif
  fmt::print("{}: ring attention blockwise path (sp simulated on one device, "
             "zig-zag) vs SDPA, causal, {}\n",
             machine, dtype_name);

  std::vector<Row> rows;
  for (int64_t t : cfg.seqs) {
    for (int64_t b : cfg.batches) {
      for (int64_t h : cfg.heads) {
        std::vector<int64_t> sps = cfg.sps;
        if (sps.empty())
          sps = {std::clamp<int64_t>(t / 2048, 2, 16)};
        for (int64_t sp : sps) {
          for (const std::string &kernel : cfg.kernels) {
            Row r = measure(cfg, device, dtype, b, h, t, sp, kernel);
            if (r.status == "ok") {
              fmt::print("  B {} H {:2} T {:6} sp {:2} {:5}: fwd ring {:9.2f} "
                         "ms SDPA {:8.2f} ms | fwd+bwd ring {:9.2f} ms SDPA "
                         "{:8.2f} ms | rel err out {:.2e} grads {:.2e}\n",
                         b, h, t, r.sp, kernel, r.ring_fwd_ms, r.sdpa_fwd_ms,
                         r.ring_train_ms, r.sdpa_train_ms, r.out_err,
                         r.grad_err);
            } else {
              fmt::print("  B {} H {:2} T {:6} sp {:2} {:5}: skipped ({})\n",
                         b, h, t, r.sp, kernel, r.status);
            }
            rows.push_back(r);
          }
        }
      }
    }
  }

  // bf16 inputs: the ring path computes in float, SDPA in bf16 with float
  // accumulation, so agreement is at bf16 rounding.
  const double tolerance = dtype == at::kBFloat16 ? 2e-2 : 1e-4;
  bool agree = true;
  std::vector<std::string> lines = {
      "| B | H | T | sp (block T/sp) | block kernel | ring fwd ms | SDPA fwd "
      "ms | ring/SDPA "
      "fwd | ring fwd+bwd ms | SDPA fwd+bwd ms | "
      "ring/SDPA fwd+bwd | rel err out | rel err grads |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"};
  for (const Row &r : rows) {
    if (r.status != "ok") {
      lines.push_back(
          fmt::format("| {} | {} | {} | {} ({}) | {} | {} | | | | | | | |",
                      r.batch, r.heads, r.seq, r.sp, r.seq / r.sp, r.kernel,
                      r.status));
      continue;
    }
    agree = agree && r.out_err <= tolerance && r.grad_err <= tolerance;
    lines.push_back(
        fmt::format("| {} | {} | {} | {} ({}) | {} | {:.2f} | {:.2f} | "
                    "{:.2f}x | "
                    "{:.2f} | {:.2f} | {:.2f}x | "
                    "{:.2e} | {:.2e} |",
                    r.batch, r.heads, r.seq, r.sp, r.seq / r.sp, r.kernel,
                    r.ring_fwd_ms,
                    r.sdpa_fwd_ms, r.ring_fwd_ms / r.sdpa_fwd_ms,
                    r.ring_train_ms, r.sdpa_train_ms,
                    r.ring_train_ms / r.sdpa_train_ms, r.out_err, r.grad_err));
  }
  const std::string config = fmt::format(
      "causal attention, {}, head_dim {}, q/k/v (B, H, T, {}) random normal; "
      "ring = blockwise_ring_attention: sp ranks "
      "simulated on one device (zig-zag shards, each shard's queries against "
      "every key block in ring order, online-softmax merge in fp32; block "
      "kernel fused = one SDPA kernel per block returning its "
      "log-sum-exp, cuDNN's (flash's where cuDNN does not take the block; backward: the kernel's backward given "
      "the row's final out and lse), "
      "math = block matmul + logsumexp in fp32; the per-step work of "
      "ring_attn without communication); SDPA "
      "= at::scaled_dot_product_attention(is_causal) on the full sequence; fwd "
      "under no_grad, fwd+bwd = forward + "
      "backward of all three inputs; mean of {} calls after {} warm-up, wall "
      "clock with device sync; the table's "
      "ring/SDPA is ring ms / SDPA ms (the JSON ratio is SDPA ms / ring ms, as "
      "paged_attention's); rel err = max |ring - SDPA| / max |SDPA| (grads: "
      "worst of dq, dk, dv)",
      dtype_name, cfg.head_dim, cfg.head_dim, cfg.iters, cfg.warmup);
  fmt::print("\n{}\n\n", config);
  for (const auto &l : lines)
    fmt::print("{}\n", l);
  if (!agree)
    fmt::print(stderr,
               "bench_ring_attention: ring and SDPA disagree beyond {:.0e}\n",
               tolerance);

  const fs::path repo = bench::repo_root();
  const std::string commit =
      bench::commit_or(cfg.commit, repo, "unknown (pass --commit)");
  const std::string date = bench::today(bench::kDateTimeUtc);
  std::string section =
      fmt::format("\n## ring_attention — {}\n\nmachine: {}; commit {}; torch "
                  "{}\ncommand: `{}`\n"
                  "config: {}\n\n",
                  date, machine, commit, TORCH_VERSION, cfg.command, config);
  for (const auto &l : lines)
    section += l + "\n";
  std::string jsonl;
  for (const Row &r : rows) {
    if (r.status != "ok")
      continue;
    auto emit = [&](const std::string &metric, double ring_ms, double sdpa_ms,
                    double err) {
      jsonl +=
          nlohmann::json{
              {"date", date},
              {"commit", commit},
              {"machine", machine},
              {"bench", "ring_attention"},
              {"config", config},
              {"batch", r.batch},
              {"heads", r.heads},
              {"seq_len", r.seq},
              {"sp", r.sp},
              {"block_kernel", r.kernel},
              {"metric", metric},
              {"value", ring_ms},
              {"impl", "colossus ring attention blockwise path (sp simulated, "
                       "zig-zag)"},
              {"peer",
               "at::scaled_dot_product_attention (causal, full sequence)"},
              {"peer_value", sdpa_ms},
              {"ratio", sdpa_ms / ring_ms},
              {"rel_err", err}}
              .dump() +
          "\n";
    };
    emit("ms_fwd", r.ring_fwd_ms, r.sdpa_fwd_ms, r.out_err);
    emit("ms_fwd_bwd", r.ring_train_ms, r.sdpa_train_ms, r.grad_err);
  }
  const auto append = bench::append_file;
  if (!cfg.out_dir.empty()) {
    fs::create_directories(cfg.out_dir);
    append(fs::path(cfg.out_dir) / "ring_attention_RESULTS.md", section);
    append(fs::path(cfg.out_dir) / "ring_attention_results.jsonl", jsonl);
    fmt::print(
        "wrote {}/ring_attention_RESULTS.md, ring_attention_results.jsonl\n",
        cfg.out_dir);
  }
  // Only device runs are results; a CPU run is a build check.
  if (cfg.record && device.is_cuda()) {
    append(repo / "bench/RESULTS.md", section);
    append(repo / "bench/results.jsonl", jsonl);
    fmt::print("appended to {} and {}\n", (repo / "bench/RESULTS.md").string(),
               (repo / "bench/results.jsonl").string());
  }
  return agree ? 0 : 3;
} catch (const std::exception &e) {
  fmt::print(stderr, "bench_ring_attention: {}\n", e.what());
  return 1;
}
