// Where a benchmark's device time goes, kernel by kernel: runs a callable
// under the Kineto profiler (CUDA activity) and sums device time per kernel
// name, so a training step's breakdown (matmuls, attention, norms, the loss,
// the optimizer, the elementwise rest) can be printed beside a peer's. The
// categories are guesses from kernel names (cuBLAS/CUTLASS, flash/cuDNN
// attention, Triton's generated kernels...), stated as such where printed.
#pragma once

#include <ATen/DeviceAccelerator.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace bench {

struct KernelStat {
  std::string name;
  double device_ms = 0;  // per profiled step
  double calls = 0;      // per profiled step
};

// The category of a kernel, from its name (lower-cased substrings).
inline std::string kernel_category(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("flash") || has("fmha") || has("attention") || has("sdpa") || has("cudnn")) return "attention";
  if (has("gemm") || has("cutlass") || has("xmma") || has("nvjet") || has("cublas") || has("sm90_") || has("matmul"))
    return "matmul";
  if (has("adam") || has("multi_tensor")) return "optimizer";
  if (has("layer_norm") || has("layernorm") || has("rms_norm") || has("rmsnorm")) return "norm";
  if (has("softmax") || has("nll") || has("cross_entropy")) return "loss/softmax";
  if (has("triton")) return "triton fused";
  if (has("memcpy") || has("memset")) return "memcpy/memset";
  if (has("reduce")) return "reduction";
  return "elementwise/other";
}

// Runs `step` `steps` times under the profiler and returns the CUDA kernels
// (and memcpy/memset) by total device time per step, largest first. Writes a
// Chrome trace to `trace_path` when it is not empty.
inline std::vector<KernelStat> profile_kernels(const std::function<void()>& step, int steps,
                                               const std::string& trace_path = "") {
  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  at::accelerator::synchronizeDevice(0);
  prof::prepareProfiler(impl::ProfilerConfig(impl::ProfilerState::KINETO), {impl::ActivityType::CPU, impl::ActivityType::CUDA});
  prof::enableProfiler(impl::ProfilerConfig(impl::ProfilerState::KINETO), {impl::ActivityType::CPU, impl::ActivityType::CUDA});
  for (int i = 0; i < steps; ++i) step();
  at::accelerator::synchronizeDevice(0);
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  std::map<std::string, KernelStat> by_name;
  for (const prof::KinetoEvent& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    KernelStat& s = by_name[e.name()];
    s.name = e.name();
    s.device_ms += static_cast<double>(e.durationNs()) * 1e-6 / steps;
    s.calls += 1.0 / steps;
  }
  if (!trace_path.empty()) result->save(trace_path);
  std::vector<KernelStat> out;
  for (auto& [name, s] : by_name) out.push_back(std::move(s));
  std::sort(out.begin(), out.end(), [](const KernelStat& a, const KernelStat& b) { return a.device_ms > b.device_ms; });
  return out;
}

inline nlohmann::json kernels_json(const std::vector<KernelStat>& kernels) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& k : kernels) out.push_back({{"name", k.name}, {"device_ms", k.device_ms}, {"calls", k.calls}});
  return out;
}

inline std::vector<KernelStat> kernels_from_json(const nlohmann::json& j) {
  std::vector<KernelStat> out;
  for (const auto& k : j) out.push_back({k.at("name").get<std::string>(), k.at("device_ms").get<double>(), k.at("calls").get<double>()});
  return out;
}

// Device ms per step by category.
inline std::map<std::string, double> by_category(const std::vector<KernelStat>& kernels) {
  std::map<std::string, double> out;
  for (const auto& k : kernels) out[kernel_category(k.name)] += k.device_ms;
  return out;
}

}  // namespace bench
