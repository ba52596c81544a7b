// `colossus check`: what this installation is (versions, devices, backends,
// kernels) and whether each part works (a collective on 2 local ranks per
// backend, each kernel against its reference). Exit code 1 on any FAIL.
#include "colossus/cli/commands.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/accelerator.h"
#include "colossus/kernels/registry.h"

#include <torch/headeronly/version.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sys/wait.h>

namespace colossus::cli {

namespace {

struct CheckResult {
  std::string name;
  bool passed;
  std::string detail;
  double seconds;
};

// Runs a command, returns (exit code, combined output).
std::pair<int, std::string> run_capture(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {127, "popen failed"};
  std::array<char, 4096> buffer{};
  while (fgets(buffer.data(), buffer.size(), pipe) != nullptr) output += buffer.data();
  int status = pclose(pipe);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return {code, output};
}

// The lines worth showing from a failed run: errors first, then the end.
std::string failure_summary(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  std::string summary;
  int shown = 0;
  for (const auto& line : lines) {
    if (shown < 4 && (line.find("rror") != std::string::npos || line.find("what()") != std::string::npos)) {
      summary += line + "\n      ";
      ++shown;
    }
  }
  for (size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i) summary += lines[i] + "\n      ";
  return summary;
}

template <typename F>
CheckResult timed(const std::string& name, F&& fn) {
  auto start = std::chrono::steady_clock::now();
  auto [passed, detail] = fn();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {name, passed, detail, seconds};
}

std::string gib(int64_t bytes) { return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1ull << 30)); }

}  // namespace

Command add_check_command(CLI::App& app) {
  auto* sub = app.add_subcommand("check", "Print versions, devices, backends and kernels, and self-test each");
  auto json = std::make_shared<bool>(false);
  auto ranks = std::make_shared<int>(2);
  sub->add_flag("--json", *json, "Print one JSON object instead of text");
  sub->add_option("--ranks", *ranks, "Local ranks for the collective self-test")->check(CLI::Range(1, 64));
  return {sub, [json, ranks]() -> int {
            nlohmann::json report;
            report["colossus"] = COLOSSUS_VERSION;
            report["libtorch"] = TORCH_VERSION;
            auto accel = probe_accelerator();
            report["cuda_build"] = accel.has_value();
            if (accel) {
              for (const auto& [k, v] : accel->versions) report["versions"][k] = v;
              report["devices"] = nlohmann::json::array();
              for (const auto& d : accel->devices) {
                report["devices"].push_back({{"index", d.index}, {"name", d.name}, {"total_bytes", d.total_bytes},
                                             {"free_bytes", d.free_bytes},
                                             {"compute_capability", fmt::format("{}.{}", d.compute_major, d.compute_minor)},
                                             {"multiprocessors", d.multiprocessors}});
              }
              if (!accel->error.empty()) report["cuda_error"] = accel->error;
            }
            std::vector<CheckResult> results;
            std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
            for (const auto& backend : cluster::registered_backends()) {
              bool available = cluster::backend_available(backend);
              report["backends"][backend] = available ? "available" : "built in, no device";
              if (!available) continue;
              // NCCL needs one GPU per rank.
              int nranks = *ranks;
              if (backend == "nccl" && accel) nranks = std::min<int>(nranks, static_cast<int>(accel->devices.size()));
              results.push_back(timed(fmt::format("collectives/{} on {} local ranks", backend, nranks), [&] {
                auto [code, out] = run_capture(fmt::format("'{}' run --nproc_per_node {} --backend {} '{}' _selftest --backend {}",
                                                           self, nranks, backend, self, backend));
                bool ok = code == 0 && out.find("selftest passed") != std::string::npos;
                return std::make_pair(ok, ok ? std::string() : fmt::format("exit {}: {}", code, failure_summary(out)));
              }));
            }
            for (const auto& kernel : kernels::registered_kernels()) {
              report["kernels"].push_back(kernel.name + "/" + kernel.device);
              results.push_back(timed(fmt::format("kernel {}/{}", kernel.name, kernel.device), [&] {
                std::string error;
                try {
                  error = kernel.self_test();
                } catch (const std::exception& e) {
                  error = e.what();
                }
                return std::make_pair(error.empty(), error);
              }));
            }
            bool all_passed = true;
            for (const auto& r : results) {
              all_passed &= r.passed;
              report["checks"].push_back({{"name", r.name}, {"status", r.passed ? "PASS" : "FAIL"},
                                          {"detail", r.detail}, {"seconds", r.seconds}});
            }
            report["passed"] = all_passed;
            if (*json) {
              std::cout << report.dump(2) << std::endl;
              return all_passed ? 0 : 1;
            }
            std::cout << fmt::format("Colossus {}  (LibTorch {})\n", COLOSSUS_VERSION, TORCH_VERSION);
            if (!accel) {
              std::cout << "CUDA: not in this build (CPU only)\n";
            } else {
              for (const auto& [k, v] : accel->versions) std::cout << fmt::format("{}: {}\n", k, v);
              if (!accel->error.empty()) std::cout << "CUDA error: " << accel->error << "\n";
              for (const auto& d : accel->devices) {
                std::cout << fmt::format("GPU {}: {}, {} total, {} free, compute capability {}.{}, {} SMs\n", d.index,
                                         d.name, gib(d.total_bytes), gib(d.free_bytes), d.compute_major,
                                         d.compute_minor, d.multiprocessors);
              }
            }
            for (const auto& [name, state] : report["backends"].items()) {
              std::cout << fmt::format("backend {}: {}\n", name, state.get<std::string>());
            }
            for (const auto& r : results) {
              std::cout << fmt::format("{}  {} ({:.1f} s){}\n", r.passed ? "PASS" : "FAIL", r.name, r.seconds,
                                       r.detail.empty() ? "" : "\n      " + r.detail);
            }
            std::cout << (all_passed ? "all checks passed" : "some checks FAILED") << std::endl;
            return all_passed ? 0 : 1;
          }};
}

}  // namespace colossus::cli
