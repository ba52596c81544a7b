// Decode attention over the paged KV cache on one GPU (CUDA builds only):
// paged_attention() with the CUDA kernels (kernels/paged_attention.h: split-K
// flash-decoding, GQA-shared K/V loads) against (a) the reference path
// (paged_attention_reference: gather + SDPA per sequence) and (b) the HBM
// roofline: the bytes the step must read (K and V of every cached token,
// plus q, out and the block tables) at the device-to-device copy bandwidth
// measured in the same run. llama-1b-like heads: 32 query / 8 KV heads of
// 64, bf16, blocks of 16 tokens spread at random over the pool. A short
// chunked-prefill section times the prefill kernels (tensor cores, CUDA
// cores) the same way.
// Prints a table; appends to bench/RESULTS.md and bench/results.jsonl (and,
// with --out-dir, writes the same section and rows there too).
//
// Usage: bench_paged_attention [--batches 1,16,64,256] [--contexts 512,2048,8192]
//                              [--iters N] [--out-dir DIR] [--commit SHA] [--no-record]
#include "colossus/inference/attention/paged_attention.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/paged_attention.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using colossus::inference::AttentionMetadata;

constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 64, kBlockSize = 16;

struct Config {
  std::vector<int64_t> batches = {1, 16, 64, 256};
  std::vector<int64_t> contexts = {512, 2048, 8192};
  int iters = 50;
  int warmup = 5;
  bool record = true;
  std::string out_dir;
  std::string commit;
  std::string command = "bench_paged_attention";
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
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
    if (a == "--batches") c.batches = parse_list(next());
    else if (a == "--contexts") c.contexts = parse_list(next());
    else if (a == "--iters") c.iters = std::stoi(next());
    else if (a == "--warmup") c.warmup = std::stoi(next());
    else if (a == "--out-dir") c.out_dir = next();
    else if (a == "--commit") c.commit = next();
    else if (a == "--no-record") c.record = false;
    else throw std::runtime_error("unknown flag " + a);
  }
  return c;
}

// Mean device milliseconds per call of `fn` over `iters` calls after `warmup`.
double time_ms(int warmup, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  const auto stream = at::cuda::getCurrentCUDAStream();
  start.record(stream);
  for (int i = 0; i < iters; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return static_cast<double>(start.elapsed_time(stop)) / iters;
}

// Device-to-device copy bandwidth, bytes read + written per second.
double copy_bandwidth() {
  const int64_t bytes = int64_t{2} << 30;
  at::Tensor src = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  at::Tensor dst = at::empty_like(src);
  src.fill_(1);
  const double ms = time_ms(3, 10, [&] { dst.copy_(src); });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

std::string run_command(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The repository: two levels above the binary (<repo>/<build>/bin/bench_paged_attention).
fs::path repo_root() { return fs::canonical("/proc/self/exe").parent_path().parent_path().parent_path(); }

// A step over `batch` sequences, each `context` cached tokens (this step's
// `q_len` included), in randomly placed blocks of a pool just large enough.
struct Step {
  at::Tensor q, key_cache, value_cache;
  AttentionMetadata meta;
  double bytes = 0;  // what the step must read and write at least
};

Step make_step(int64_t batch, int64_t context, int64_t q_len) {
  Step st;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = batch * blocks_per_seq;
  st.key_cache = at::randn({num_blocks, kKvHeads, kBlockSize, kHeadDim}, bf16);
  st.value_cache = at::randn({num_blocks, kKvHeads, kBlockSize, kHeadDim}, bf16);
  const at::Tensor order = at::randperm(num_blocks, at::TensorOptions().dtype(at::kLong));
  const int64_t* perm = order.data_ptr<int64_t>();
  std::vector<int64_t> slots;
  st.meta.host_query_start.push_back(0);
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b < blocks_per_seq; ++b) table.push_back(static_cast<int32_t>(perm[s * blocks_per_seq + b]));
    for (int64_t p = context - q_len; p < context; ++p) {
      slots.push_back(table[p / kBlockSize] * kBlockSize + p % kBlockSize);
    }
    st.meta.host_block_tables.push_back(std::move(table));
    st.meta.host_context_lens.push_back(static_cast<int32_t>(context));
    st.meta.host_query_start.push_back(st.meta.host_query_start.back() + static_cast<int32_t>(q_len));
  }
  colossus::inference::upload_metadata(st.meta, slots, st.key_cache.device());
  st.q = at::randn({batch * q_len, kHeads, kHeadDim}, bf16);
  st.bytes = 2.0 * static_cast<double>(batch * context * kKvHeads * kHeadDim * 2)  // K and V, bf16
             + 2.0 * static_cast<double>(st.q.numel() * 2)                         // q and out
             + static_cast<double>(batch * blocks_per_seq * 4);                    // block tables
  return st;
}

int32_t partition_size(int64_t batch, int64_t context) {
  colossus::kernels::PagedAttentionArgs args;
  args.num_seqs = static_cast<int32_t>(batch);
  args.heads = kHeads;
  args.kv_heads = kKvHeads;
  args.head_dim = kHeadDim;
  args.max_context_len = static_cast<int32_t>(context);
  args.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return colossus::kernels::paged_attention_partition_size(args);
}

// The kernels' arguments for `st`, as paged_attention() builds them, so the
// launches can be timed without the dispatch's host work.
colossus::kernels::PagedAttentionArgs kernel_args(const Step& st, at::Tensor& out, at::Tensor& workspace) {
  colossus::kernels::PagedAttentionArgs a;
  out = at::empty_like(st.q);
  a.out = out.data_ptr();
  a.q = st.q.data_ptr();
  a.out_token_stride = out.stride(0);
  a.out_head_stride = out.stride(1);
  a.q_token_stride = st.q.stride(0);
  a.q_head_stride = st.q.stride(1);
  a.key_cache = st.key_cache.data_ptr();
  a.value_cache = st.value_cache.data_ptr();
  a.block_tables = st.meta.block_tables.data_ptr<int32_t>();
  a.block_table_stride = st.meta.block_tables.stride(0);
  a.query_start = st.meta.query_start.data_ptr<int32_t>();
  a.context_lens = st.meta.context_lens.data_ptr<int32_t>();
  a.num_seqs = static_cast<int32_t>(st.meta.num_seqs());
  a.num_tokens = static_cast<int32_t>(st.q.size(0));
  a.heads = kHeads;
  a.kv_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.block_size = kBlockSize;
  a.max_blocks_per_seq = static_cast<int32_t>(st.meta.block_tables.size(1));
  a.max_query_len = static_cast<int32_t>(st.meta.max_query_len);
  a.max_context_len = static_cast<int32_t>(st.meta.max_context_len);
  a.has_decode_seqs = a.max_query_len == 1;
  a.has_prefill_seqs = a.max_query_len > 1;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  a.dtype = colossus::kernels::AttentionDtype::kBFloat16;
  a.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  if (!colossus::kernels::paged_attention_cuda_supports(a)) throw std::runtime_error("kernels refuse the bench shape");
  const size_t bytes = colossus::kernels::paged_attention_workspace_bytes(a);
  workspace = at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 16))},
                        at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  a.workspace = workspace.data_ptr();
  return a;
}

struct Row {
  std::string kind;  // "decode" or "prefill"
  int64_t batch, context, q_len;
  double mib, ours_us, kernel_us, ref_us, roofline_us, max_diff;
  int32_t partition;
  double flops;         // prefill: 4 * heads * head_dim * visible (query, key) pairs
  double cuda_core_us;  // prefill: the CUDA-core kernel's launches alone
};

}  // namespace

int main(int argc, char** argv) try {
  const Config cfg = parse(argc, argv);
  if (!at::hasCUDA()) throw std::runtime_error("no CUDA device");
  if (colossus::kernels::cuda_slots().paged_attention == nullptr) {
    throw std::runtime_error("this binary has no CUDA paged-attention kernels (build with -DCOLOSSUS_CUDA=ON)");
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  const double bandwidth = copy_bandwidth();
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  fmt::print("{}: {} SMs; device-to-device copy {:.0f} GB/s (read + write)\n", prop->name, prop->multiProcessorCount,
             bandwidth / 1e9);

  std::vector<Row> rows;
  auto measure = [&](const std::string& kind, int64_t batch, int64_t context, int64_t q_len) {
    Step st = make_step(batch, context, q_len);
    at::Tensor ours;
    const double ours_ms = time_ms(cfg.warmup, cfg.iters, [&] {
      ours = colossus::inference::paged_attention(st.q, st.key_cache, st.value_cache, st.meta, {.scale = scale});
    });
    at::Tensor direct_out, workspace;
    const auto args = kernel_args(st, direct_out, workspace);
    const auto stream = at::cuda::getCurrentCUDAStream().stream();
    const double kernel_ms =
        time_ms(cfg.warmup, cfg.iters, [&] { colossus::kernels::paged_attention_cuda(args, stream); });
    at::Tensor ref;
    // The reference loops over sequences on the host: fewer calls.
    const int ref_iters = batch >= 64 ? 2 : 5;
    const double ref_ms = time_ms(1, ref_iters, [&] {
      ref = colossus::inference::paged_attention_reference(st.q, st.key_cache, st.value_cache, st.meta, {.scale = scale});
    });
    const auto diff = [&](const at::Tensor& x) {
      return (x.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>();
    };
    double max_diff = std::max(diff(ours), diff(direct_out));
    double cuda_core_ms = 0;
    if (kind == "prefill") {
      auto cuda_cores = args;
      cuda_cores.prefill_tensor_cores = false;
      cuda_core_ms =
          time_ms(cfg.warmup, cfg.iters, [&] { colossus::kernels::paged_attention_cuda(cuda_cores, stream); });
      max_diff = std::max(max_diff, diff(direct_out));
    }
    double pairs = 0;  // (query, key) pairs each query sees
    for (int64_t j = 0; j < q_len; ++j) pairs += static_cast<double>(context - q_len + j + 1);
    Row r{kind, batch, context, q_len, st.bytes / (1 << 20), ours_ms * 1e3, kernel_ms * 1e3, ref_ms * 1e3,
          st.bytes / bandwidth * 1e6, max_diff, kind == "decode" ? partition_size(batch, context) : 0,
          4.0 * kHeads * kHeadDim * pairs * static_cast<double>(batch), cuda_core_ms * 1e3};
    fmt::print("  {} batch {:4} context {:5} q_len {:4}: {:9.1f} us, kernels alone {:9.1f} us (reference {:10.1f} us), "
               "max |diff| {:.3g}\n",
               kind, batch, context, q_len, r.ours_us, r.kernel_us, r.ref_us, max_diff);
    rows.push_back(r);
  };
  for (int64_t b : cfg.batches) {
    for (int64_t c : cfg.contexts) measure("decode", b, c, 1);
  }
  // Chunked prefill: a whole 2K prompt, and 512-token chunks behind 1.5K cached tokens.
  measure("prefill", 1, 2048, 2048);
  measure("prefill", 4, 2048, 512);

  // The tables.
  std::vector<std::string> lines = {
      "| batch | context | KV+q+out MiB | partition | colossus us | kernels us | GB/s | % of roofline | reference us | "
      "x vs reference | roofline us | max abs diff |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"};
  for (const Row& r : rows) {
    if (r.kind != "decode") continue;
    lines.push_back(fmt::format(
        "| {} | {} | {:.1f} | {} | {:.1f} | {:.1f} | {:.0f} | {:.1f}% | {:.1f} | {:.1f} | {:.1f} | {:.2g} |", r.batch,
        r.context, r.mib, r.partition, r.ours_us, r.kernel_us, r.mib * (1 << 20) / (r.kernel_us * 1e3),
        100.0 * r.roofline_us / r.kernel_us, r.ref_us, r.ref_us / r.ours_us, r.roofline_us, r.max_diff));
  }
  std::vector<std::string> prefill_lines = {
      "| batch | q_len | context | colossus us | tensor-core kernel us | TFLOP/s | CUDA-core kernel us | TFLOP/s | "
      "reference us | x vs reference | max abs diff |",
      "|---|---|---|---|---|---|---|---|---|---|---|"};
  for (const Row& r : rows) {
    if (r.kind != "prefill") continue;
    prefill_lines.push_back(fmt::format(
        "| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2g} |", r.batch, r.q_len,
        r.context, r.ours_us, r.kernel_us, r.flops / (r.kernel_us * 1e-6) / 1e12, r.cuda_core_us,
        r.flops / (r.cuda_core_us * 1e-6) / 1e12, r.ref_us, r.ref_us / r.ours_us, r.max_diff));
  }
  fmt::print("\ndecode (bf16, {}q/{}kv heads, head_dim {}, block {}):\n", kHeads, kKvHeads, kHeadDim, kBlockSize);
  for (const auto& l : lines) fmt::print("{}\n", l);
  fmt::print("\nchunked prefill (same heads; tensor-core kernel, and the CUDA-core one for comparison):\n");
  for (const auto& l : prefill_lines) fmt::print("{}\n", l);

  if (!cfg.record) return 0;
  const fs::path repo = repo_root();
  std::string commit = cfg.commit;
  if (commit.empty()) {
    commit = run_command(fmt::format("git -C '{}' rev-parse --short HEAD 2>/dev/null", repo.string()));
  }
  if (commit.empty()) commit = "unknown (pass --commit)";
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const std::string machine = fmt::format("1x {} ({} SMs), driver CUDA {}.{}, runtime {}.{}", prop->name,
                                          prop->multiProcessorCount, driver / 1000, driver % 1000 / 10, runtime / 1000,
                                          runtime % 1000 / 10);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const std::string config = fmt::format(
      "decode, bf16, {} query / {} KV heads, head_dim {}, block {}, blocks shuffled over the pool, one new token per "
      "sequence; colossus = paged_attention() (CUDA kernels, host dispatch included), kernels = the same launches with "
      "prebuilt arguments (GB/s and % of roofline use this), each the mean of {} calls after {} warm-up, CUDA events; "
      "reference = paged_attention_reference (gather + SDPA per sequence); roofline = K+V+q+out "
      "bytes at the measured device-to-device copy bandwidth ({:.0f} GB/s, read + write)",
      kHeads, kKvHeads, kHeadDim, kBlockSize, cfg.iters, cfg.warmup, bandwidth / 1e9);
  std::string section = fmt::format("\n## paged_attention — {}\n\nmachine: {}; commit {}; torch {}\ncommand: `{}`\n"
                                    "config: {}\n\n",
                                    date, machine, commit, TORCH_VERSION, cfg.command, config);
  for (const auto& l : lines) section += l + "\n";
  section += "\nChunked prefill, same heads: the tensor-core kernel (mma.sync m16n8k16, what paged_attention() "
             "runs for bf16) and the CUDA-core one (fp32 FMAs; fp32 inputs and head_dim 256 use it); TFLOP/s counts "
             "4 * heads * head_dim per visible (query, key) pair:\n\n";
  for (const auto& l : prefill_lines) section += l + "\n";

  std::string jsonl;
  for (const Row& r : rows) {
    const std::string impl =
        r.kind == "decode" ? "colossus paged decode kernels (split-K)" : "colossus paged prefill kernel (tensor cores)";
    auto emit = [&](const std::string& who, double us, const std::string& peer, double peer_us) {
      jsonl += nlohmann::json{{"date", date},
                              {"commit", commit},
                              {"machine", machine},
                              {"bench", "paged_attention"},
                              {"config", config},
                              {"kind", r.kind},
                              {"batch", r.batch},
                              {"context", r.context},
                              {"q_len", r.q_len},
                              {"metric", "us_per_call"},
                              {"value", us},
                              {"impl", who},
                              {"peer", peer},
                              {"peer_value", peer_us},
                              {"ratio", peer_us / us},
                              {"max_abs_diff", r.max_diff}}
                   .dump() +
               "\n";
    };
    emit(impl + ", through paged_attention()", r.ours_us, "reference: gather + SDPA per sequence", r.ref_us);
    if (r.kind == "prefill") {
      emit("colossus paged prefill kernel on CUDA cores, launches alone", r.cuda_core_us,
           "colossus paged prefill kernel on tensor cores, launches alone", r.kernel_us);
    }
    if (r.kind == "decode") {
      emit(impl + ", launches alone", r.kernel_us, "roofline: bytes at device-to-device copy bandwidth",
           r.roofline_us);
    }
  }
  const auto append = [](const fs::path& path, const std::string& text) {
    std::ofstream f(path, std::ios::app);
    f << text;
    if (!f) throw std::runtime_error("cannot write " + path.string());
  };
  append(repo / "bench/RESULTS.md", section);
  append(repo / "bench/results.jsonl", jsonl);
  fmt::print("\nappended to {} and {}\n", (repo / "bench/RESULTS.md").string(),
             (repo / "bench/results.jsonl").string());
  if (!cfg.out_dir.empty()) {
    append(fs::path(cfg.out_dir) / "paged_attention_RESULTS.md", section);
    append(fs::path(cfg.out_dir) / "paged_attention_results.jsonl", jsonl);
    fmt::print("and wrote the same to {}/paged_attention_RESULTS.md, paged_attention_results.jsonl\n", cfg.out_dir);
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_paged_attention: {}\n", e.what());
  return 1;
}
